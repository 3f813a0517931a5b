//! Fingerprints of create requests, to tell a retry (same parameters) from a request id
//! reused by mistake (other parameters). They are stored with the request id, so their
//! encoding is part of the data: each field is written in an explicit, tagged,
//! length-prefixed form that no compiler, library upgrade or map type changes.
//!
//! Stores written before this encoding hold the `Debug`-based digest of the fields; a
//! lookup accepts that one too ([`Fingerprint::legacy`]), so a retry that spans the
//! upgrade still finds its object.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;

use sha2::{Digest, Sha256};

/// The prefix of fingerprints in this encoding (legacy ones are bare hex).
const VERSION: &str = "v2:";

/// A request field with a stable encoding.
pub trait Canonical: Debug {
    fn encode(&self, out: &mut Vec<u8>);
}

fn tagged(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    out.push(tag);
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

impl Canonical for str {
    fn encode(&self, out: &mut Vec<u8>) {
        tagged(out, b's', self.as_bytes());
    }
}

impl Canonical for String {
    fn encode(&self, out: &mut Vec<u8>) {
        self.as_str().encode(out);
    }
}

impl Canonical for bool {
    fn encode(&self, out: &mut Vec<u8>) {
        tagged(out, b'b', &[u8::from(*self)]);
    }
}

macro_rules! integers {
    ($($t:ty),*) => {$(
        impl Canonical for $t {
            fn encode(&self, out: &mut Vec<u8>) {
                // Every integer as i128, so a field's type may widen without a new print.
                tagged(out, b'i', &i128::from(*self).to_le_bytes());
            }
        }
    )*};
}
integers!(i32, i64, u32, u64);

impl<T: Canonical> Canonical for Option<T> {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            None => tagged(out, b'n', &[]),
            Some(v) => {
                let mut inner = Vec::new();
                v.encode(&mut inner);
                tagged(out, b'o', &inner);
            }
        }
    }
}

/// A map as its entries in key order, whatever map holds them.
fn map<'a, K: Canonical + 'a, V: Canonical + 'a>(
    entries: impl Iterator<Item = (&'a K, &'a V)>,
    out: &mut Vec<u8>,
) {
    let mut encoded: Vec<Vec<u8>> = entries
        .map(|(k, v)| {
            let mut e = Vec::new();
            k.encode(&mut e);
            v.encode(&mut e);
            e
        })
        .collect();
    encoded.sort();
    tagged(out, b'm', &encoded.concat());
}

impl<K: Canonical + Ord, V: Canonical> Canonical for BTreeMap<K, V> {
    fn encode(&self, out: &mut Vec<u8>) {
        map(self.iter(), out);
    }
}

impl<K: Canonical, V: Canonical> Canonical for HashMap<K, V> {
    fn encode(&self, out: &mut Vec<u8>) {
        map(self.iter(), out);
    }
}

/// A create request's fingerprint: the one stored now, and the one a store written
/// before this encoding holds for the same fields.
pub struct Fingerprint {
    pub current: String,
    pub legacy: String,
}

impl Fingerprint {
    /// The fingerprint of a request's fields, in order.
    pub fn of(fields: &[&dyn Canonical]) -> Self {
        let mut bytes = Vec::new();
        for f in fields {
            f.encode(&mut bytes);
        }
        let legacy: Vec<String> = fields.iter().map(|f| format!("{f:?}")).collect();
        Self {
            current: format!("{VERSION}{}", hex::encode(Sha256::digest(&bytes))),
            legacy: hex::encode(Sha256::digest(legacy.join("\u{1f}").as_bytes())),
        }
    }

    /// Whether `stored` (from the store) is this request's fingerprint.
    pub fn matches(&self, stored: &str) -> bool {
        stored == self.current || stored == self.legacy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_encoding_is_pinned_and_ignores_the_map_type() {
        let b: BTreeMap<String, String> =
            [("b".into(), "2".into()), ("a".into(), "1".into())].into();
        let h: HashMap<String, String> = b.clone().into_iter().collect();
        let from_btree = Fingerprint::of(&[&"team-a".to_string(), &b, &3i32, &true]);
        let from_hash = Fingerprint::of(&[&"team-a".to_string(), &h, &3i64, &true]);
        assert_eq!(from_btree.current, from_hash.current);
        // Pinned: a change to the encoding would turn stored request ids into conflicts.
        assert_eq!(
            Fingerprint::of(&[&"x".to_string(), &1u32]).current,
            "v2:".to_string()
                + &hex::encode(Sha256::digest(
                    [
                        &b"s"[..],
                        &1u64.to_le_bytes(),
                        b"x",
                        b"i",
                        &16u64.to_le_bytes(),
                        &1i128.to_le_bytes(),
                    ]
                    .concat()
                ))
        );
    }

    #[test]
    fn fields_are_delimited_and_typed() {
        let s = |v: &str| v.to_string();
        assert_ne!(
            Fingerprint::of(&[&s("ab"), &s("c")]).current,
            Fingerprint::of(&[&s("a"), &s("bc")]).current
        );
        assert_ne!(
            Fingerprint::of(&[&s("1")]).current,
            Fingerprint::of(&[&1i64]).current
        );
        assert_ne!(
            Fingerprint::of(&[&None::<String>]).current,
            Fingerprint::of(&[&Some(s(""))]).current
        );
    }

    #[test]
    fn a_print_stored_before_the_upgrade_still_matches_its_retry() {
        let fields: [&dyn Canonical; 2] = [&"team-a".to_string(), &8i32];
        let print = Fingerprint::of(&fields);
        // What the previous release stored for the same fields: Debug text, joined.
        let before = hex::encode(Sha256::digest("\"team-a\"\u{1f}8".as_bytes()));
        assert!(print.matches(&before));
        assert!(print.matches(&print.current));
        assert!(!print.matches(&Fingerprint::of(&[&"team-b".to_string(), &8i32]).legacy));
        assert!(!print.matches(&format!("v2:{before}")));
    }
}
