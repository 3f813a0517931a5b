//! Munge, Slurm's authentication: one key per tenant cluster, and one `munged` per cluster
//! and host serving that key on a socket of its own. A client or daemon whose munged holds
//! another key cannot talk to the cluster.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine;
use rand::RngCore;

use super::daemon::{Daemon, Spec};

/// Key length in bytes (munged accepts 32 to 1024).
pub const KEY_BYTES: usize = 128;

pub fn new_key() -> Vec<u8> {
    let mut key = vec![0u8; KEY_BYTES];
    rand::thread_rng().fill_bytes(&mut key);
    key
}

pub fn encode(key: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(key)
}

pub fn decode(text: &str) -> Result<Vec<u8>, String> {
    let key = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("munge_key: not base64: {e}"))?;
    check_key(&key)?;
    Ok(key)
}

pub fn check_key(key: &[u8]) -> Result<(), String> {
    if !(32..=1024).contains(&key.len()) {
        return Err(format!(
            "munge_key: must be 32 to 1024 bytes (got {})",
            key.len()
        ));
    }
    Ok(())
}

/// The files of one munged, all in `dir`.
pub struct Paths {
    pub key: PathBuf,
    pub socket: PathBuf,
    pub pid: PathBuf,
    pub log: PathBuf,
    pub seed: PathBuf,
}

impl Paths {
    pub fn in_dir(dir: &Path) -> Paths {
        Paths {
            key: dir.join("munge.key"),
            socket: dir.join("munge.sock"),
            pid: dir.join("munged.pid"),
            log: dir.join("munged.log"),
            seed: dir.join("munged.seed"),
        }
    }
}

/// Writes the key (mode 0600, as munged requires) unless the same key is there already.
pub fn write_key(path: &Path, key: &[u8]) -> std::io::Result<bool> {
    if std::fs::read(path).is_ok_and(|k| k == key) {
        return Ok(false);
    }
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(key)?;
    Ok(true)
}

/// What munged runs with on `paths`, serving `key` (its digest only: a spec is logged).
pub fn spec(paths: &Paths, key: &[u8]) -> Spec {
    use sha2::Digest;
    let arg = |p: &Path| p.display().to_string();
    Spec {
        program: "munged".into(),
        args: vec![
            "--foreground".into(),
            "--force".into(),
            "--key-file".into(),
            arg(&paths.key),
            "--socket".into(),
            arg(&paths.socket),
            "--pid-file".into(),
            arg(&paths.pid),
            "--log-file".into(),
            arg(&paths.log),
            "--seed-file".into(),
            arg(&paths.seed),
        ],
        env: Vec::new(),
        log: paths.log.with_extension("out"),
        config: format!("key {}", hex::encode(sha2::Sha256::digest(key))),
    }
}

/// Starts munged in the foreground on `paths` (the key written there already) and waits
/// until its socket answers.
pub fn start(name: &str, paths: &Paths, key: &[u8]) -> Result<Daemon, String> {
    super::check_socket_path(name, &paths.socket)?;
    let _ = std::fs::remove_file(&paths.socket);
    let daemon =
        Daemon::start(name, spec(paths, key)).map_err(|e| format!("cannot start munged: {e}"))?;
    wait_for_socket(&paths.socket, &daemon)?;
    Ok(daemon)
}

/// The munged a former agent started on `paths` with `key`, when it still runs and
/// answers on its socket (see [`Daemon::adopt`]).
pub fn adopt(name: &str, paths: &Paths, key: &[u8]) -> Option<Daemon> {
    let daemon = Daemon::adopt(name, &spec(paths, key), None)?;
    if std::os::unix::net::UnixStream::connect(&paths.socket).is_err() {
        tracing::warn!(daemon = %name, "a kept munged does not answer on its socket: starting it again");
        daemon.stop();
        return None;
    }
    Some(daemon)
}

fn wait_for_socket(socket: &Path, daemon: &Daemon) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(&daemon.spec.log).unwrap_or_default();
            return Err(format!(
                "munged did not open {} within 15 s: {}",
                socket.display(),
                log.lines().last().unwrap_or("no output")
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_round_trip_and_are_bounded() {
        let k = super::new_key();
        assert_eq!(super::decode(&super::encode(&k)).unwrap(), k);
        assert_ne!(super::new_key(), k);
        assert!(super::decode("c2hvcnQ=")
            .unwrap_err()
            .contains("32 to 1024"));
        assert!(super::decode("%%%").unwrap_err().starts_with("munge_key"));
    }
}
