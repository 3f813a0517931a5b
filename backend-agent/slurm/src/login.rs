//! A Slurm tenant cluster's login endpoint: an `sshd` of its own on the cluster's head node
//! (where its primary controller runs) that lets in the cluster's account only, with the team's public keys only, and gives
//! each session `SLURM_CONF` (the cluster's client configuration, whose munge socket only
//! that account can reach). No password, no root, no forwarding, no user environment: a
//! team gets a shell as its own unprivileged user, from which `sinfo`, `srun` and `sbatch`
//! work, and nothing that grants more (no munge key leaves the platform).
//!
//! The sshd, and so every session, runs in the cluster's login [`Sandbox`]: a mount
//! namespace with its own `/tmp`, `/var/tmp` and `/dev/shm` (tmpfs, shared by the
//! cluster's sessions and gone when the login stops), a `/proc` that shows the account
//! its own processes only (`hidepid=invisible`), and a user database without the other
//! clusters' accounts. One namespace per login rather than per session (a ForceCommand
//! or PAM wrapper): a login lets in one account only, so its sessions are one team's,
//! and a namespace made by sshd's parent covers every way in (shell, exec, sftp) alike.
//!
//! The host key is the cluster's, not the host's: the control plane makes it once
//! ([`new_host_key`]) and hands it to whichever node runs the login, so a team's
//! `known_hosts` keeps trusting the same key when the login moves to another node.
//!
//! Blocking (the daemon): async callers go through spawn_blocking.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine;

use super::daemon::{Daemon, Spec};
use super::login_limits::LoginCgroup;
use super::sandbox::{self, Sandbox};

/// At most this many public keys per cluster, each at most this long.
pub const MAX_KEYS: usize = 32;
pub const MAX_KEY_BYTES: usize = 16 * 1024;

/// The key types sshd accepts from a team (OpenSSH 9.2's public key algorithms, without
/// DSA, which it no longer accepts).
const KEY_TYPES: &[&str] = &[
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
];

/// Checks a team's public keys as `ssh_public_keys` gives them (a trailing newline, as
/// `file("id_ed25519.pub")` reads, is fine): one OpenSSH public key per entry, no options,
/// no duplicates.
pub fn check_public_keys(keys: &[String]) -> Result<(), String> {
    if keys.len() > MAX_KEYS {
        return Err(format!(
            "ssh_public_keys: at most {MAX_KEYS} keys (got {})",
            keys.len()
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, key) in keys.iter().enumerate() {
        let (kind, blob) =
            check_public_key(key).map_err(|e| format!("ssh_public_keys[{i}]: {e}"))?;
        if !seen.insert((kind, blob)) {
            return Err(format!(
                "ssh_public_keys[{i}]: the same key is listed twice"
            ));
        }
    }
    Ok(())
}

/// One public key: `TYPE BASE64 [COMMENT]`; (type, base64) when it is one.
fn check_public_key(key: &str) -> Result<(&str, &str), String> {
    if key.len() > MAX_KEY_BYTES {
        return Err(format!("at most {MAX_KEY_BYTES} bytes (got {})", key.len()));
    }
    let line = key.strip_suffix('\n').unwrap_or(key);
    if line.chars().any(|c| c.is_control() && c != '\t') {
        return Err("one key on one line, without control characters".into());
    }
    let mut words = line.split_whitespace();
    let kind = words
        .next()
        .ok_or("empty; give an OpenSSH public key such as the contents of ~/.ssh/id_ed25519.pub")?;
    if !KEY_TYPES.contains(&kind) {
        return Err(format!(
            "must start with the key type ({}), without options; got {:?}",
            KEY_TYPES.join(", "),
            kind.chars().take(40).collect::<String>()
        ));
    }
    let b64 = words.next().ok_or("the key's base64 data is missing")?;
    let blob = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("the key data is not base64: {e}"))?;
    // The blob starts with its own type, length-prefixed (RFC 4253 section 6.6).
    let named = blob
        .get(..4)
        .map(|l| u32::from_be_bytes([l[0], l[1], l[2], l[3]]) as usize)
        .and_then(|n| blob.get(4..4 + n));
    if named != Some(kind.as_bytes()) {
        return Err(format!("the key data is not a {kind} key"));
    }
    Ok((kind, b64))
}

/// authorized_keys from the team's keys: one per line, exactly as given otherwise.
pub fn authorized_keys(keys: &[String]) -> String {
    keys.iter()
        .map(|k| format!("{}\n", k.trim_end_matches('\n')))
        .collect()
}

/// The login's files in its private directory.
pub struct Files {
    pub host_key: PathBuf,
    pub config: PathBuf,
    pub pid: PathBuf,
    pub log: PathBuf,
}

impl Files {
    pub fn in_dir(dir: &Path) -> Files {
        Files {
            host_key: dir.join("ssh_host_ed25519_key"),
            config: dir.join("sshd_config"),
            pid: dir.join("sshd.pid"),
            log: dir.join("sshd.log"),
        }
    }
}

/// A login host key: an OpenSSH private key, and the public key as `TYPE BASE64`.
#[derive(Clone, Debug, PartialEq)]
pub struct HostKey {
    pub private: String,
    pub public: String,
}

/// A new ed25519 host key, in the format ssh-keygen writes (unencrypted), made here from
/// the system's random source: the control plane makes each cluster's once.
pub fn new_host_key() -> Result<HostKey, String> {
    use ring::rand::SecureRandom;
    let mut seed = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut seed)
        .map_err(|_| "cannot read the system's random source".to_string())?;
    let pair = ring::signature::Ed25519KeyPair::from_seed_unchecked(&seed)
        .map_err(|e| format!("cannot make an ed25519 key: {e}"))?;
    use ring::signature::KeyPair;
    let public: [u8; 32] = pair
        .public_key()
        .as_ref()
        .try_into()
        .map_err(|_| "an ed25519 public key is 32 bytes".to_string())?;
    let mut check = [0u8; 4];
    ring::rand::SystemRandom::new()
        .fill(&mut check)
        .map_err(|_| "cannot read the system's random source".to_string())?;
    Ok(openssh_ed25519(&seed, &public, u32::from_be_bytes(check)))
}

/// An SSH wire string: its length (4 bytes, big endian), then its bytes.
fn put_string(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// The public key blob of an ed25519 key (RFC 8709).
fn ed25519_blob(public: &[u8; 32]) -> Vec<u8> {
    let mut blob = Vec::new();
    put_string(&mut blob, b"ssh-ed25519");
    put_string(&mut blob, public);
    blob
}

/// The key in OpenSSH's private key format (PROTOCOL.key: no cipher, no KDF, one key).
fn openssh_ed25519(seed: &[u8; 32], public: &[u8; 32], check: u32) -> HostKey {
    let blob = ed25519_blob(public);
    let mut private = Vec::new();
    private.extend_from_slice(&check.to_be_bytes());
    private.extend_from_slice(&check.to_be_bytes());
    put_string(&mut private, b"ssh-ed25519");
    put_string(&mut private, public);
    let mut secret = seed.to_vec();
    secret.extend_from_slice(public);
    put_string(&mut private, &secret);
    put_string(&mut private, b"gpufleet-login");
    // Padded to the (absent) cipher's block size, 8, with 1, 2, 3, ...
    let mut pad = 1u8;
    while private.len() % 8 != 0 {
        private.push(pad);
        pad += 1;
    }
    let mut body = b"openssh-key-v1\0".to_vec();
    put_string(&mut body, b"none");
    put_string(&mut body, b"none");
    put_string(&mut body, b"");
    body.extend_from_slice(&1u32.to_be_bytes());
    put_string(&mut body, &blob);
    put_string(&mut body, &private);
    let b64 = base64::engine::general_purpose::STANDARD.encode(&body);
    let mut pem = String::from("-----BEGIN OPENSSH PRIVATE KEY-----\n");
    for line in b64.as_bytes().chunks(70) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END OPENSSH PRIVATE KEY-----\n");
    HostKey {
        private: pem,
        public: format!(
            "ssh-ed25519 {}",
            base64::engine::general_purpose::STANDARD.encode(&blob)
        ),
    }
}

/// Writes the login's host key (0600, as sshd requires) unless the same one is there.
pub fn write_host_key(files: &Files, private: &str) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if std::fs::read_to_string(&files.host_key).is_ok_and(|k| k == private) {
        return Ok(());
    }
    if !private.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----\n") || private.len() > 16 * 1024 {
        return Err("login.host_key: not an OpenSSH private key".into());
    }
    let _ = std::fs::remove_file(&files.host_key);
    std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(&files.host_key)
        .and_then(|mut f| f.write_all(private.as_bytes()))
        .map_err(|e| format!("cannot write {}: {e}", files.host_key.display()))
}

/// The line a team puts in its known_hosts to check the login's host key.
pub fn known_hosts_line(addr: &str, port: u16, host_key: &str) -> String {
    format!("[{addr}]:{port} {host_key}")
}

/// Where the login listens, who may log in and with which keys.
#[derive(Clone, Debug, PartialEq)]
pub struct Login {
    pub addr: String,
    pub port: u16,
    pub user: String,
    /// The cluster's client configuration, for SLURM_CONF.
    pub slurm_conf: PathBuf,
    /// The team's keys (root's file, readable by the cluster's group).
    pub authorized_keys: PathBuf,
    /// The team volume mounts its sessions see (their own tenant's; None: the host's).
    pub volumes: Option<sandbox::Volumes>,
    /// The home mounts its sessions see (their own cluster's; None: the host's).
    pub homes: Option<sandbox::Volumes>,
}

/// sshd_config for the cluster's login.
pub fn sshd_config(login: &Login, files: &Files) -> String {
    format!(
        "# Login endpoint of a gpufleet Slurm tenant cluster: its own user, its team's keys.\n\
         ListenAddress {addr}\n\
         Port {port}\n\
         HostKey {host_key}\n\
         PidFile {pid}\n\
         AllowUsers {user}\n\
         AuthorizedKeysFile {keys}\n\
         AuthenticationMethods publickey\n\
         PubkeyAuthentication yes\n\
         PasswordAuthentication no\n\
         KbdInteractiveAuthentication no\n\
         HostbasedAuthentication no\n\
         PermitRootLogin no\n\
         PermitEmptyPasswords no\n\
         PermitUserEnvironment no\n\
         PermitUserRC no\n\
         UsePAM no\n\
         StrictModes no\n\
         AllowTcpForwarding no\n\
         AllowStreamLocalForwarding no\n\
         AllowAgentForwarding no\n\
         GatewayPorts no\n\
         X11Forwarding no\n\
         PermitTunnel no\n\
         PrintMotd no\n\
         SetEnv SLURM_CONF={conf}\n",
        addr = login.addr,
        port = login.port,
        host_key = files.host_key.display(),
        pid = files.pid.display(),
        user = login.user,
        keys = login.authorized_keys.display(),
        conf = login.slurm_conf.display(),
    )
}

/// sshd, absolute as it must be run (it re-executes itself for each connection).
fn sshd_program() -> Option<PathBuf> {
    ["/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// What identifies a login's sshd beside its command line: its configuration's text and
/// its host key's digest (the key itself stays out of a spec, which is logged).
pub fn identity(config: &str, host_key: &str) -> String {
    use sha2::Digest;
    format!(
        "{config}\nhost key {}",
        hex::encode(sha2::Sha256::digest(host_key.as_bytes()))
    )
}

/// What the login's sshd runs: `files.config` (whose text, with the host key's, is
/// `identity`), in `cgroup` (made and limited by the caller).
fn daemon(
    login: &Login,
    files: &Files,
    cgroup: &LoginCgroup,
    identity: &str,
) -> Result<(Spec, Sandbox), String> {
    let program = sshd_program().ok_or("sshd is missing (install openssh-server)")?;
    let own_dir = files
        .config
        .parent()
        .ok_or("the login's files have no directory")?;
    // The user databases the sessions see live with the login's other runtime files (not
    // secrets: a subset of the host's world-readable ones).
    let runtime = login
        .slurm_conf
        .parent()
        .ok_or("the login's client configuration has no directory")?;
    let etc_layer = sandbox::user_databases(runtime, &login.user)?;
    let spec = Spec {
        program: program.display().to_string(),
        args: vec![
            "-D".into(),
            "-e".into(),
            "-f".into(),
            files.config.display().to_string(),
        ],
        env: Vec::new(),
        log: files.log.clone(),
        config: identity.to_string(),
    };
    Ok((
        spec,
        Sandbox::login(
            etc_layer,
            own_dir,
            cgroup.procs_files(),
            login.volumes.clone(),
            login.homes.clone(),
        ),
    ))
}

/// The login's sshd a former agent started as [`start`] would now, when it still runs (see
/// [`Daemon::adopt`]): the team's sessions stay open.
pub fn adopt(
    name: &str,
    login: &Login,
    files: &Files,
    cgroup: &LoginCgroup,
    identity: &str,
) -> Option<Daemon> {
    let (spec, sandbox) = daemon(login, files, cgroup, identity).ok()?;
    Daemon::adopt(name, &spec, Some(sandbox))
}

/// Starts the login's sshd on `files.config` (whose text, with the host key's, is
/// `identity`), in `cgroup` (made and limited by the caller), and waits until it listens.
pub fn start(
    name: &str,
    login: &Login,
    files: &Files,
    cgroup: &LoginCgroup,
    identity: &str,
) -> Result<Daemon, String> {
    let (spec, sandbox) = daemon(login, files, cgroup, identity)?;
    // sshd wants its privilege separation directory (Debian makes it at service start).
    std::fs::create_dir_all("/run/sshd").map_err(|e| format!("cannot create /run/sshd: {e}"))?;
    let check = Command::new(&spec.program)
        .arg("-t")
        .arg("-f")
        .arg(&files.config)
        .output()
        .map_err(|e| format!("cannot run sshd: {e}"))?;
    if !check.status.success() {
        return Err(format!(
            "sshd refuses its configuration: {}",
            String::from_utf8_lossy(&check.stderr).trim()
        ));
    }
    let daemon = Daemon::start_sandboxed(name, spec, sandbox)
        .map_err(|e| format!("cannot start sshd: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(15);
    let addr = format!("{}:{}", login.addr, login.port)
        .parse::<std::net::SocketAddr>()
        .map_err(|e| format!("login address {}:{}: {e}", login.addr, login.port))?;
    while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(&files.log).unwrap_or_default();
            daemon.stop();
            return Err(format!(
                "the login's sshd did not listen on {addr} within 15 s: {}",
                log.lines().last().unwrap_or("no output")
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(daemon)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_host_key_is_one_ssh_keygen_reads_and_each_is_new() {
        let key = new_host_key().unwrap();
        assert!(key.public.starts_with("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5"));
        check_public_keys(std::slice::from_ref(&key.public)).unwrap();
        assert_ne!(new_host_key().unwrap().public, key.public);
        // The same format ssh-keygen writes: it derives the same public key from it.
        let dir = tempfile::tempdir().unwrap();
        let files = Files::in_dir(dir.path());
        write_host_key(&files, &key.private).unwrap();
        let out = Command::new("ssh-keygen")
            .arg("-y")
            .arg("-f")
            .arg(&files.host_key)
            .output()
            .expect("ssh-keygen (Debian's openssh-client)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let derived = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            derived
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" "),
            key.public
        );
        assert!(write_host_key(&files, "not a key").is_err());
    }

    const ED25519: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIUbCEB1wtwHnPpUtmvbvCP/oP71XRKXWqho1010j2Sr alice@laptop";

    #[test]
    fn team_keys_are_openssh_public_keys_without_options() {
        check_public_keys(&[
            ED25519.to_string(),
            format!("{ED25519}\n")[..].replace("alice", "bob"),
        ])
        .unwrap_err();
        check_public_keys(&[format!("{ED25519}\n")]).unwrap();
        let err = |k: &str| check_public_keys(&[k.to_string()]).unwrap_err();
        assert!(err(&format!("command=\"/bin/sh\" {ED25519}")).contains("without options"));
        assert!(err("ssh-ed25519 notbase64!").contains("not base64"));
        // An RSA type over an ed25519 blob.
        let mislabelled = ED25519.replacen("ssh-ed25519", "ssh-rsa", 1);
        assert!(err(&mislabelled).contains("not a ssh-rsa key"));
        assert!(err(&format!("{ED25519}\n{ED25519}")).contains("one line"));
        assert!(err("").starts_with("ssh_public_keys[0]: empty"));
        let many = vec![ED25519.to_string(); MAX_KEYS + 1];
        assert!(check_public_keys(&many).unwrap_err().contains("at most 32"));
        assert_eq!(
            authorized_keys(&[format!("{ED25519}\n")]),
            format!("{ED25519}\n")
        );
    }
}
