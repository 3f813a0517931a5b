//! The account a Slurm tenant cluster's work runs as: one unprivileged system user and
//! group per cluster, named like the cluster (`gf<12 hex>`), with the same uid and gid on
//! every host (the control plane allocates them, so a munge credential means the same
//! user everywhere). Its password is `*` (no password, not locked: sshd with public keys
//! only lets it in) and its shell `/bin/sh`.
//!
//! Each host also has the cluster's runtime directory, `/run/gpufleet/<cluster>/`, which
//! only root and the cluster's group can enter (0750): what the cluster's user must reach
//! lives there (each node's part: munge socket, slurmd and login configuration, slurmd's
//! spool; and the account's home); keys, logs and the controller's state stay in the
//! private data dirs (or, for the state, on the shared storage). Another cluster's user, or any
//! other local user, cannot open it, so cannot reach its munged. `/run/gpufleet` itself
//! is 0711: anyone may pass through it to the directory it belongs to, no one but root
//! may list it (the names of the clusters a host serves are no one else's business).
//!
//! Removing an account ends its processes and waits until none is left (a bounded wait:
//! what still runs after it is named in the error), removes what it owned in the host's
//! shared temporary directories (`/tmp`, `/var/tmp`, `/dev/shm`, `/run/lock`), then the
//! user and group. Its sessions and jobs have private ones (see `sandbox`, and
//! `job_container/tmpfs`), so that finds nothing unless something escaped them; it is
//! there so that nothing owned by a deleted uid outlives the cluster whatever happened.
//!
//! Blocking (useradd, getent): async callers go through spawn_blocking.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Where the clusters' runtime directories are, on every host.
pub const RUNTIME_ROOT: &str = "/run/gpufleet";
/// Cluster accounts have uids (and gids) `FIRST_UID..FIRST_UID + UIDS`: far above the
/// ranges of people (1000..60000), systemd's dynamic users and usual subuid ranges, so a
/// cluster's uid is never a person's or a daemon's.
pub const FIRST_UID: u32 = 1_900_000_000;
pub const UIDS: u32 = 100_000_000;

/// How long concurrent useradd/userdel runs (agents of one host) are retried for.
const RETRY_FOR: Duration = Duration::from_secs(10);
/// How long a removed account's killed processes are waited for (one in uninterruptible
/// sleep, in I/O to a slow disk, ends only when that returns).
const END_WITHIN: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
}

impl Account {
    /// The account of cluster `cluster` (a name from [`super::cluster_name`]) with `uid`;
    /// refused outside the cluster accounts' range (never root, never a person).
    pub fn new(cluster: &str, uid: u32) -> Result<Account, String> {
        if !super::valid_cluster_name(cluster) || !cluster.starts_with("gf") || cluster.len() > 32 {
            return Err(format!(
                "cluster: {cluster:?} is not a Slurm cluster name gpufleet makes"
            ));
        }
        if !(FIRST_UID..FIRST_UID.saturating_add(UIDS)).contains(&uid) {
            return Err(format!(
                "uid: {uid} is outside the cluster accounts' range {FIRST_UID}..{}",
                FIRST_UID + UIDS
            ));
        }
        Ok(Account {
            name: cluster.to_string(),
            uid,
        })
    }

    /// The `attempt`-th candidate uid of a cluster: spread over the range by its id, so
    /// the clusters of several control planes (or of tests sharing one host) rarely meet;
    /// the control plane takes the first candidate no other cluster has.
    pub fn candidate_uid(cluster_id: &str, attempt: u32) -> u32 {
        let hash = cluster_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        FIRST_UID + ((hash + u64::from(attempt)) % u64::from(UIDS)) as u32
    }

    /// Creates the user and group on this host unless they exist with these ids; refuses
    /// when the name or the ids belong to someone else.
    pub fn ensure(&self, home: &Path) -> Result<(), String> {
        let deadline = Instant::now() + RETRY_FOR;
        loop {
            match self.lookup()? {
                Found::Same => return Ok(()),
                Found::Nothing => {}
            }
            let made = self.create(home);
            match made {
                Ok(()) => return Ok(()),
                // Another agent of this host made it meanwhile, or held the lock.
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(account = %self.name, error = %e, "useradd failed; looking again");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn lookup(&self) -> Result<Found, String> {
        let by_name = getent("passwd", &self.name);
        let by_uid = getent("passwd", &self.uid.to_string());
        let group = getent("group", &self.uid.to_string());
        match (&by_name, &by_uid) {
            (Some(n), _) if field(n, 2) != Some(self.uid.to_string().as_str()) => Err(format!(
                "the account {} exists on this host with uid {}, not {}",
                self.name,
                field(n, 2).unwrap_or("?"),
                self.uid
            )),
            (None, Some(u)) => Err(format!(
                "uid {} belongs to {} on this host, not to cluster account {}",
                self.uid,
                field(u, 0).unwrap_or("?"),
                self.name
            )),
            _ => match &group {
                Some(g) if field(g, 0) != Some(self.name.as_str()) => Err(format!(
                    "gid {} belongs to group {} on this host, not to cluster account {}",
                    self.uid,
                    field(g, 0).unwrap_or("?"),
                    self.name
                )),
                _ if by_name.is_some() && group.is_some() => Ok(Found::Same),
                _ => Ok(Found::Nothing),
            },
        }
    }

    fn create(&self, home: &Path) -> Result<(), String> {
        let id = self.uid.to_string();
        if getent("group", &id).is_none() {
            run("groupadd", &["-g", &id, &self.name])?;
        }
        if getent("passwd", &self.name).is_none() {
            let home = home.display().to_string();
            let comment = format!("gpufleet Slurm cluster {}", self.name);
            run(
                "useradd",
                &[
                    "-u", &id, "-g", &id, "-M", "-d", &home, "-s", "/bin/sh", "-p", "*", "-c",
                    &comment, &self.name,
                ],
            )?;
        }
        Ok(())
    }

    /// Ends every process of the account on this host and waits until none is left,
    /// removes its files from the host's temporary directories, then removes the user
    /// and group. Fails naming the processes that outlived the wait (the user and group
    /// stay then: a uid still running is not given to another cluster).
    pub fn remove(&self) -> Result<(), String> {
        let left = end_processes_of(self.uid, Instant::now() + END_WITHIN);
        if !left.is_empty() {
            return Err(format!(
                "account {}: {} process(es) still run {} s after SIGKILL: {}",
                self.name,
                left.len(),
                END_WITHIN.as_secs(),
                left.join(", ")
            ));
        }
        for dir in SHARED_TEMP {
            remove_owned_by(Path::new(dir), self.uid);
        }
        let deadline = Instant::now() + RETRY_FOR;
        loop {
            let mut failed = Vec::new();
            if getent("passwd", &self.name).is_some() {
                if let Err(e) = run("userdel", &[&self.name]) {
                    failed.push(e);
                }
            }
            if getent("group", &self.name).is_some() {
                if let Err(e) = run("groupdel", &[&self.name]) {
                    failed.push(e);
                }
            }
            if failed.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(failed.join("; "));
            }
            kill_processes_of(self.uid);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The host's temporary directories every local user may write to.
pub const SHARED_TEMP: &[&str] = &["/tmp", "/var/tmp", "/dev/shm", "/run/lock"];

/// Removes every entry under `dir` (not `dir` itself) owned by `uid`, whole trees
/// included, staying on `dir`'s filesystem and following no symbolic link.
pub fn remove_owned_by(dir: &Path, uid: u32) {
    use std::os::unix::fs::MetadataExt;
    let Ok(top) = std::fs::symlink_metadata(dir) else {
        return;
    };
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.dev() != top.dev() {
                continue;
            }
            if meta.uid() == uid {
                let removed = if meta.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                if let Err(e) = removed {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove a removed account's file");
                }
            } else if meta.is_dir() {
                stack.push(path);
            }
        }
    }
}

enum Found {
    Same,
    Nothing,
}

/// The line `getent DATABASE KEY` prints, if any.
fn getent(database: &str, key: &str) -> Option<String> {
    let out = Command::new("getent").args([database, key]).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|l| !l.is_empty())
}

fn field(line: &str, n: usize) -> Option<&str> {
    line.split(':').nth(n)
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program}: {e} (cluster accounts need root)"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{program} {} failed: {}",
        args.last().unwrap_or(&""),
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

/// SIGKILL to every process of `uid` (its jobs and login sessions) on this host.
pub fn kill_processes_of(uid: u32) {
    for (pid, _) in processes_of(uid) {
        // SAFETY: kill only sends a signal.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// SIGKILL to every process of `uid`, again until none is left or `deadline` passes
/// (a process may fork while it is being killed, or take time to exit); the processes
/// left then, as `pid (command)`. At most this many are named.
pub fn end_processes_of(uid: u32, deadline: Instant) -> Vec<String> {
    const NAMED: usize = 16;
    loop {
        let left = processes_of(uid);
        if left.is_empty() {
            return Vec::new();
        }
        for (pid, _) in &left {
            // SAFETY: kill only sends a signal.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
        if Instant::now() > deadline {
            tracing::warn!(
                uid,
                left = left.len(),
                "processes of a removed account outlived SIGKILL"
            );
            return left
                .into_iter()
                .take(NAMED)
                .map(|(pid, comm)| format!("{pid} ({comm})"))
                .collect();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The processes of this host whose real uid is `uid`: (pid, command name). A zombie
/// counts until its parent reaps it (userdel counts it too).
fn processes_of(uid: u32) -> Vec<(i32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<i32>().ok()?;
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            let owner = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().next())
                .and_then(|real| real.parse::<u32>().ok());
            let comm = status
                .lines()
                .find_map(|l| l.strip_prefix("Name:"))
                .unwrap_or_default()
                .trim()
                .to_string();
            (owner == Some(uid)).then_some((pid, comm))
        })
        .collect()
}

/// SIGKILL to every process whose environment holds `entry` and to all their
/// descendants. A node's slurmd runs with `SLURM_CONF=<its own config>`, and each
/// slurmstepd it starts inherits it: a running job's slurmstepd (root) outlives slurmd,
/// and its job's processes are its descendants.
pub fn kill_environ_holders(entry: &str) {
    let table = processes();
    let marked: Vec<i32> = table
        .iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{}/environ", p.pid))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == entry.as_bytes()))
        })
        .map(|p| p.pid)
        .collect();
    kill_trees(&table, &marked, true);
}

/// [`kill_environ_holders`] of every process with an environment entry that starts with
/// `prefix` (e.g. any slurm.conf of one cluster's runtime directory).
pub fn kill_environ_prefix(prefix: &str) {
    let table = processes();
    let marked: Vec<i32> = table
        .iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{}/environ", p.pid)).is_ok_and(|env| {
                env.split(|b| *b == 0)
                    .any(|kv| kv.starts_with(prefix.as_bytes()))
            })
        })
        .map(|p| p.pid)
        .collect();
    kill_trees(&table, &marked, true);
}

/// SIGKILL to every descendant of `pid` (not `pid` itself): e.g. a login sshd's sessions,
/// before the sshd is stopped.
pub fn kill_descendants(pid: i32) {
    // No pid (a daemon between restarts) is no process: pid 0's "descendants" are all.
    if pid > 1 {
        kill_trees(&processes(), &[pid], false);
    }
}

struct Process {
    pid: i32,
    ppid: i32,
}

/// Every process with its parent, from /proc.
fn processes() -> Vec<Process> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<i32>().ok()?;
            // "pid (comm) state ppid ...": comm may hold spaces, so read after its ')'.
            let ppid = std::fs::read_to_string(e.path().join("stat"))
                .ok()?
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<i32>().ok())?;
            Some(Process { pid, ppid })
        })
        .collect()
}

/// SIGKILL to the descendants of `roots` (first, so that no job is left to be reparented
/// away from its stepd), then to `roots` when `roots_too`.
fn kill_trees(table: &[Process], roots: &[i32], roots_too: bool) {
    let mut doomed: Vec<i32> = Vec::new();
    let mut frontier = roots.to_vec();
    while let Some(p) = frontier.pop() {
        for child in table.iter().filter(|c| c.ppid == p) {
            if !doomed.contains(&child.pid) && !roots.contains(&child.pid) {
                doomed.push(child.pid);
                frontier.push(child.pid);
            }
        }
    }
    let roots = if roots_too { roots } else { &[] };
    for pid in doomed.iter().chain(roots.iter()) {
        // SAFETY: kill only sends a signal.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
}

/// The cluster's runtime directory on this host.
pub fn runtime_dir(cluster: &str) -> PathBuf {
    Path::new(RUNTIME_ROOT).join(cluster)
}

/// Creates `path` (and its parents) and gives it owner `uid`, group `gid` and `mode`.
pub fn own_dir(path: &Path, uid: u32, gid: u32, mode: u32) -> Result<(), String> {
    std::fs::create_dir_all(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    chown(path, uid, gid)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("cannot set the mode of {}: {e}", path.display()))
}

/// Writes `text` to `path` (unless it holds it already), owned by root and `gid`, `mode`.
pub fn write_shared(path: &Path, text: &str, gid: u32, mode: u32) -> Result<(), String> {
    if std::fs::read_to_string(path).is_ok_and(|t| t == text) {
        return Ok(());
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    chown(&tmp, 0, gid)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("cannot set the mode of {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn chown(path: &Path, uid: u32, gid: u32) -> Result<(), String> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
        .map_err(|e| format!("cannot give {} to uid {uid}: {e}", path.display()))
}

/// The cluster's runtime directory with the account's group (made if missing).
pub fn prepare_runtime(account: &Account) -> Result<PathBuf, String> {
    let root = Path::new(RUNTIME_ROOT);
    own_dir(root, 0, 0, 0o711)?;
    let dir = runtime_dir(&account.name);
    own_dir(&dir, 0, account.uid, 0o750)?;
    Ok(dir)
}

/// The account's home in a cluster's runtime directory.
pub const HOME: &str = "home";

/// The account's home on this host, `/run/gpufleet/<cluster>/home` (the account's home in
/// its user database, where sessions start and jobs find `$HOME`): a link to `target`,
/// the team volume's mount path (the same on every node of the cluster, so the home is
/// too) or the cluster's home file system on this host (`crate::home_fs`). A directory
/// there that already holds files (an older agent's home of this host) is kept rather
/// than replaced by the link (and said so in the log): nothing of the team's is deleted
/// here.
pub fn node_home(account: &Account, target: &Path) -> Result<PathBuf, String> {
    let home = runtime_dir(&account.name).join(HOME);
    match std::fs::symlink_metadata(&home).ok() {
        Some(m) if m.file_type().is_symlink() => {
            if std::fs::read_link(&home).is_ok_and(|t| t == target) {
                return Ok(home);
            }
            std::fs::remove_file(&home)
                .map_err(|e| format!("cannot replace {}: {e}", home.display()))?;
        }
        // A directory removed only when empty (else kept: see above).
        Some(m) if m.is_dir() && std::fs::remove_dir(&home).is_err() => {
            tracing::warn!(home = %home.display(), target = %target.display(), "the account's home holds files from before: it stays a directory of this host, unbounded");
            return Ok(home);
        }
        Some(m) if m.is_dir() => {}
        Some(_) => {
            let _ = std::fs::remove_file(&home);
        }
        None => {}
    }
    link_home(&home, target)?;
    Ok(home)
}

/// Whether the account's home on this host is a directory (an older agent's home of this
/// host, or one kept by [`node_home`]), not a link.
pub fn home_is_directory(cluster: &str) -> bool {
    std::fs::symlink_metadata(runtime_dir(cluster).join(HOME)).is_ok_and(|m| m.is_dir())
}

fn link_home(home: &Path, target: &Path) -> Result<(), String> {
    std::os::unix::fs::symlink(target, home).map_err(|e| {
        format!(
            "cannot link {} to {}: {e}",
            home.display(),
            target.display()
        )
    })
}

/// Removes node `part` of the cluster's runtime directory; when no other node of the
/// cluster is left on this host (only the home, which is the nodes' and goes with the
/// last of them), also the directory and the account (its processes ended first).
pub fn release_node(cluster: &str, part: &str) -> Result<(), String> {
    let dir = runtime_dir(cluster);
    remove_all(&dir.join(part))?;
    let others = std::fs::read_dir(&dir)
        .map(|d| d.flatten().filter(|e| e.file_name() != HOME).count())
        .unwrap_or(0);
    if others > 0 {
        return Ok(());
    }
    forget(cluster)
}

/// Removes the cluster's whole runtime directory and its account from this host.
pub fn forget(cluster: &str) -> Result<(), String> {
    remove_all(&runtime_dir(cluster))?;
    // The account by its name: only one of ours (a cluster name, a uid of our range).
    let Some(line) = getent("passwd", cluster) else {
        return Ok(());
    };
    let uid = field(&line, 2).and_then(|u| u.parse().ok()).unwrap_or(0);
    Account::new(cluster, uid)?.remove()
}

fn remove_all(path: &Path) -> Result<(), String> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot remove {}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descendants_of_a_process_end_and_it_stays() {
        let mut parent = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .unwrap();
        let pid = parent.id() as i32;
        let child = loop {
            if let Some(c) = processes().iter().find(|p| p.ppid == pid) {
                break c.pid;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        kill_descendants(0); // no pid: nothing
        kill_descendants(pid);
        // `wait` returns once its child is killed: the shell ends by itself.
        let status = parent.wait().unwrap();
        assert!(
            status.code().is_some(),
            "the shell itself was not killed: {status:?}"
        );
        // The shell reaped its killed child before it ended.
        assert!(!std::path::Path::new(&format!("/proc/{child}")).exists());
    }

    #[test]
    fn files_of_a_uid_are_removed_from_a_directory_tree_and_others_stay() {
        let dir = tempfile::tempdir().unwrap();
        let mine = dir.path().join("mine");
        std::fs::create_dir_all(mine.join("deep")).unwrap();
        std::fs::write(mine.join("deep/file"), "x").unwrap();
        let theirs = dir.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::write(theirs.join("kept"), "x").unwrap();
        std::fs::write(theirs.join("gone"), "x").unwrap();
        let uid = FIRST_UID + 1;
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(
            root,
            "this test gives files to another uid: it needs root, as CI runs"
        );
        for p in [
            &mine,
            &mine.join("deep"),
            &mine.join("deep/file"),
            &theirs.join("gone"),
        ] {
            chown(p, uid, uid).unwrap();
        }
        remove_owned_by(dir.path(), uid);
        assert!(!mine.exists());
        assert!(!theirs.join("gone").exists());
        assert!(theirs.join("kept").exists());
    }

    #[test]
    fn accounts_are_cluster_names_with_uids_of_their_own_range() {
        let uid = Account::candidate_uid("79bb28b1-5b97-4c1e-9d7a-000000000000", 0);
        assert!((FIRST_UID..FIRST_UID + UIDS).contains(&uid));
        assert_eq!(
            Account::candidate_uid("79bb28b1-5b97-4c1e-9d7a-000000000000", 1),
            uid + 1
        );
        assert_ne!(
            Account::candidate_uid("79bb28b1-5b97-4c1e-9d7a-000000000001", 0),
            uid
        );
        assert!(Account::new("gf0123456789ab", uid).is_ok());
        assert!(Account::new("gf0123456789ab", 0)
            .unwrap_err()
            .starts_with("uid: 0 is outside"));
        assert!(Account::new("gf0123456789ab", 1000).is_err());
        assert!(Account::new("root", uid).is_err());
        assert!(Account::new("../etc", uid).is_err());
    }
}
