//! The join token node agents present, and its rotation with an overlap
//! (`gpufleet-agent token rotate join --overlap 1h`, the admin): the new secret replaces
//! `<data-dir>/join.token`, and the old one keeps working for new sessions until its
//! overlap ends, also across a restart of serve (`join.token.retiring` keeps the hashes
//! of retiring secrets, never the secrets, with when each retires). Sessions already open
//! are not ended: an agent's session is checked when it opens.
//!
//! A join token only lets an agent ask to join: the platform's admission still decides
//! (`agents::admission`), and with mutual TLS the agent's certificate names the node.

use std::path::PathBuf;
use std::sync::RwLock;

use crate::secrets::{hash_token, new_token, same_token};

/// The admin-owned token name that means the join token in the token RPCs.
pub const JOIN_TOKEN_NAME: &str = "join";
/// Beside the data dir's `join.token`.
const RETIRING_FILE: &str = "join.token.retiring";
/// Retiring secrets kept at most (older ones are dropped first).
const MAX_RETIRING: usize = 16;

pub struct JoinTokens {
    inner: RwLock<Inner>,
    /// The data dir's `join.token`; None when serve was given the token from outside
    /// (GPUFLEET_JOIN_TOKEN): then it cannot rotate it.
    file: Option<PathBuf>,
}

struct Inner {
    current: String,
    /// Hashes of rotated secrets and when each stops working.
    retiring: Vec<(String, i64)>,
}

/// Why a join token is refused.
pub enum Refused {
    /// Not a join token of this control plane.
    Unknown,
    /// Rotated, and its overlap ended then.
    Retired(i64),
}

impl JoinTokens {
    /// A token given from outside, which cannot rotate.
    pub fn fixed(current: String) -> Self {
        Self {
            inner: RwLock::new(Inner {
                current,
                retiring: Vec::new(),
            }),
            file: None,
        }
    }

    /// The token serve was started with, and where it lives (None: from outside). Reads
    /// the retiring list beside that file. Blocking.
    pub fn new(current: String, file: Option<PathBuf>) -> std::io::Result<Self> {
        let retiring = match &file {
            Some(f) => read_retiring(&f.with_file_name(RETIRING_FILE))?,
            None => Vec::new(),
        };
        Ok(Self {
            inner: RwLock::new(Inner { current, retiring }),
            file,
        })
    }

    /// The secret agents should present now (embedded agents use it).
    pub fn current(&self) -> String {
        self.inner.read().expect("join tokens").current.clone()
    }

    /// Whether `token` may open a session at `now`.
    pub fn check(&self, token: &str, now: i64) -> Result<(), Refused> {
        let inner = self.inner.read().expect("join tokens");
        if same_token(token, &inner.current) {
            return Ok(());
        }
        let hash = hash_token(token);
        match inner.retiring.iter().find(|(h, _)| same_token(h, &hash)) {
            Some(&(_, retire_at)) if now < retire_at => Ok(()),
            Some(&(_, retire_at)) => Err(Refused::Retired(retire_at)),
            None => Err(Refused::Unknown),
        }
    }

    /// Issues a new join token; the current one keeps working until `now + overlap`.
    /// The files are replaced before the new secret is used, so a crash leaves either the
    /// old state or the new. Blocking (writes the files).
    pub fn rotate(&self, now: i64, overlap: i64) -> Result<String, String> {
        let file = self.file.as_ref().ok_or(
            "name: serve was given the join token from outside its data dir (GPUFLEET_JOIN_TOKEN or --join-token); change it there, on every agent, and restart serve instead",
        )?;
        let mut inner = self.inner.write().expect("join tokens");
        let secret = new_token("gfj_");
        let mut retiring: Vec<(String, i64)> = inner
            .retiring
            .iter()
            .filter(|(_, at)| *at > now)
            .cloned()
            .collect();
        if overlap > 0 {
            retiring.push((hash_token(&inner.current), now + overlap));
        }
        let cut = retiring.len().saturating_sub(MAX_RETIRING);
        retiring.drain(..cut);
        let text: String = retiring
            .iter()
            .map(|(h, at)| format!("{h} {at}\n"))
            .collect();
        let retiring_file = file.with_file_name(RETIRING_FILE);
        crate::secrets::replace_secret_file(&retiring_file, text.trim_end())
            .map_err(|e| format!("could not write {}: {e}", retiring_file.display()))?;
        crate::secrets::replace_secret_file(file, &secret).map_err(|e| {
            format!(
                "could not write the new join token to {}: {e}",
                file.display()
            )
        })?;
        inner.current = secret.clone();
        inner.retiring = retiring;
        Ok(secret)
    }
}

fn read_retiring(path: &std::path::Path) -> std::io::Result<Vec<(String, i64)>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(text
        .lines()
        .filter_map(|line| {
            let (hash, at) = line.trim().split_once(' ')?;
            Some((hash.to_string(), at.parse().ok()?))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(dir: &std::path::Path) -> JoinTokens {
        let file = dir.join("join.token");
        std::fs::write(&file, "gfj_old\n").unwrap();
        JoinTokens::new("gfj_old".into(), Some(file)).unwrap()
    }

    #[test]
    fn the_old_token_works_for_its_overlap_then_is_refused_saying_when() {
        let dir = tempfile::tempdir().unwrap();
        let t = tokens(dir.path());
        let new = t.rotate(1000, 60).unwrap();
        assert!(t.check(&new, 1000).is_ok());
        assert!(t.check("gfj_old", 1059).is_ok());
        assert!(matches!(
            t.check("gfj_old", 1060),
            Err(Refused::Retired(1060))
        ));
        assert!(matches!(t.check("gfj_other", 1000), Err(Refused::Unknown)));
        // The data dir holds the new secret, and only hashes of the old.
        let on_disk = std::fs::read_to_string(dir.path().join("join.token")).unwrap();
        assert_eq!(on_disk.trim(), new);
        let retiring = std::fs::read_to_string(dir.path().join(RETIRING_FILE)).unwrap();
        assert!(!retiring.contains("gfj_old"), "{retiring}");
        use std::os::unix::fs::PermissionsExt;
        for f in ["join.token", RETIRING_FILE] {
            let mode = std::fs::metadata(dir.path().join(f))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }
    }

    #[test]
    fn a_restart_within_the_overlap_keeps_the_old_token_working() {
        let dir = tempfile::tempdir().unwrap();
        let new = tokens(dir.path()).rotate(1000, 60).unwrap();
        let file = dir.path().join("join.token");
        let again = JoinTokens::new(new.clone(), Some(file)).unwrap();
        assert!(again.check("gfj_old", 1030).is_ok());
        assert!(again.check(&new, 5000).is_ok());
    }

    #[test]
    fn no_overlap_refuses_the_old_token_at_once_and_a_token_from_outside_cannot_rotate() {
        let dir = tempfile::tempdir().unwrap();
        let t = tokens(dir.path());
        t.rotate(1000, 0).unwrap();
        assert!(matches!(t.check("gfj_old", 1000), Err(Refused::Unknown)));
        let outside = JoinTokens::new("gfj_env".into(), None).unwrap();
        assert!(outside
            .rotate(1000, 60)
            .unwrap_err()
            .contains("GPUFLEET_JOIN_TOKEN"));
    }
}
