//! A token's secret: made at random, kept as a SHA-256 hash, compared in constant time,
//! and written to a file (0600) all at once. Nothing here knows who holds it.

use rand::RngCore;
use sha2::{Digest, Sha256};

/// Compares by hashing both sides first, so the time taken depends on neither the
/// length nor the content of the secret.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let (ha, hb) = (Sha256::digest(a), Sha256::digest(b));
    ha.iter()
        .zip(hb.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// Constant-time comparison of tokens (see [`constant_time_eq`]).
pub fn same_token(given: &str, expected: &str) -> bool {
    constant_time_eq(given.as_bytes(), expected.as_bytes())
}

/// Replaces a token file (0600) at once: written beside it, synced, then renamed over it,
/// so a crash leaves the old secret or the new one, never half of one.
pub fn replace_secret_file(path: &std::path::Path, secret: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let next = path.with_extension("next");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&next)?;
    writeln!(file, "{secret}")?;
    file.sync_all()?;
    std::fs::rename(&next, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The hash of a token as the store keeps it.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A fresh random token with the given prefix (`gft_` for tenants, `gfa_` for the admin).
pub fn new_token(prefix: &str) -> String {
    let mut bytes = [0u8; 24];
    rand::thread_rng().fill_bytes(&mut bytes);
    format!("{prefix}{}", hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(super::same_token("abc", "abc"));
        assert!(!super::same_token("abc", "abd"));
        assert!(!super::same_token("abc ", "abc"));
        assert!(!super::same_token("", "abc"));
    }

    #[test]
    fn tokens_are_random_and_prefixed() {
        let (a, b) = (new_token("gft_"), new_token("gft_"));
        assert!(a.starts_with("gft_") && a.len() == 52);
        assert_ne!(a, b);
        assert_eq!(hash_token(&a), hash_token(&a));
        assert_ne!(hash_token(&a), hash_token(&b));
    }

    #[test]
    fn constant_time_comparison() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret-longer"));
    }
}
