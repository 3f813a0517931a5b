//! One supervised daemon process (slurmctld, slurmd, munged or a login's sshd), run in the
//! foreground and watched by a thread of its own that restarts it when it dies, until it
//! is stopped.
//!
//! A daemon outlives its agent: it runs in a session of its own, without a death signal,
//! so a stop, crash, `kill -9` or upgrade of the agent leaves it and the jobs it runs
//! going. Its identity is kept beside its log (the [`Spec::record_path`]: pid, the
//! kernel's start time of that pid, and a digest of what it was started with), so the next
//! agent [`Daemon::adopt`]s it (watched through a pidfd, as it is no longer a child) when
//! it is the same process running the same configuration, and ends it when it is stale.
//! Only [`Daemon::stop`] ends a daemon; dropping one leaves it running.
//!
//! A daemon that serves a tenant (a login's sshd, a node's slurmd) runs in a [`Sandbox`]:
//! a mount namespace of its own, entered between fork and exec.
//!
//! Everything here blocks: async callers go through spawn_blocking.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::sandbox::Sandbox;

/// How long a stopped daemon gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Pause before a daemon that died is started again.
const RESTART_AFTER: Duration = Duration::from_millis(500);
/// The extension of a daemon's kept identity, beside its log.
const RECORD_EXTENSION: &str = "daemon";

/// What to run: the program, its arguments, and where its stdout/stderr go.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub log: PathBuf,
    /// What else the daemon reads at start (its configuration files' text, a key): part
    /// of its identity, so that a kept daemon that read another configuration is stale.
    pub config: String,
}

impl Spec {
    /// Where the daemon's identity is kept for the next agent: beside its log.
    pub fn record_path(&self) -> PathBuf {
        self.log.with_extension(RECORD_EXTENSION)
    }

    /// A digest of everything the daemon was started with.
    fn digest(&self) -> String {
        let mut h = Sha256::new();
        for part in [&self.program]
            .into_iter()
            .chain(&self.args)
            .chain(self.env.iter().flat_map(|(k, v)| [k, v]))
            .chain([&self.config])
        {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        hex::encode(&h.finalize()[..16])
    }
}

/// A daemon's identity as kept on disk: the same process (pid and the kernel's start time
/// of that pid: a pid reused by another process has another) started with the same spec.
#[derive(Debug, PartialEq)]
struct Record {
    pid: i32,
    started: u64,
    digest: String,
}

impl Record {
    fn read(path: &Path) -> Option<Record> {
        let text = std::fs::read_to_string(path).ok()?;
        let mut fields = text.split_whitespace();
        let record = Record {
            pid: fields.next()?.parse().ok().filter(|p| *p > 1)?,
            started: fields.next()?.parse().ok()?,
            digest: fields.next()?.to_string(),
        };
        fields.next().is_none().then_some(record)
    }

    /// Written whole (a temporary file renamed into place), root's alone.
    fn write(&self, path: &Path) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let tmp = path.with_extension(format!("{RECORD_EXTENSION}.tmp"));
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        writeln!(f, "{} {} {}", self.pid, self.started, self.digest)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    }

    /// Whether the recorded process still runs (not a zombie) and is the one recorded.
    fn runs(&self) -> bool {
        start_time(self.pid) == Some(self.started) && !is_zombie(self.pid)
    }
}

/// The kernel's start time of `pid` (clock ticks after boot: field 22 of its stat).
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces, so count after its ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// A pidfd of `pid`: readable once the process has ended, whoever its parent is.
fn pidfd(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a descriptor we own from here on.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Blocks until the process behind `fd` has ended.
fn wait_pidfd(fd: &OwnedFd) {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: p is one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, -1) };
        if n > 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// The process a supervisor watches: one it started (its child, which it reaps) or one a
/// former agent started (reaped by whoever is its parent now).
enum Watched {
    Child(std::process::Child),
    Adopted(OwnedFd),
}

impl Watched {
    fn wait(self) -> String {
        match self {
            Watched::Child(mut c) => format!("{:?}", c.wait()),
            Watched::Adopted(fd) => {
                wait_pidfd(&fd);
                "ended (adopted: its status went to its parent)".into()
            }
        }
    }
}

struct Shared {
    stop: AtomicBool,
    pid: AtomicI32,
    /// Times the process was started by this agent (1 + restarts; 0: adopted and not
    /// restarted since).
    starts: std::sync::atomic::AtomicU32,
}

pub struct Daemon {
    pub spec: Spec,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn spawn(spec: &Spec, sandbox: Option<&Sandbox>) -> std::io::Result<std::process::Child> {
    let prepared = sandbox.map(Sandbox::prepare).transpose()?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log)?;
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe and touches only the child's own state.
    unsafe {
        cmd.pre_exec(move || {
            // A session of its own: neither a signal to the agent's process group (Ctrl-C,
            // a service manager's stop) nor the agent's end reaches it.
            libc::setsid();
            match &prepared {
                Some(p) => p.enter(),
                None => Ok(()),
            }
        });
    }
    let child = cmd.spawn()?;
    let record = Record {
        pid: child.id() as i32,
        // Read while it is our unreaped child: the pid cannot be anyone else's yet.
        started: start_time(child.id() as i32).unwrap_or(0),
        digest: spec.digest(),
    };
    if let Err(e) = record.write(&spec.record_path()) {
        tracing::warn!(program = %spec.program, error = %e, "cannot keep the daemon's identity: the next agent will start it again");
    }
    Ok(child)
}

impl Daemon {
    /// Starts the process now (an error when it cannot be spawned at all) and supervises it.
    pub fn start(name: &str, spec: Spec) -> std::io::Result<Daemon> {
        Daemon::start_in(name, spec, None)
    }

    /// [`Daemon::start`] in `sandbox` (each restart too).
    pub fn start_sandboxed(name: &str, spec: Spec, sandbox: Sandbox) -> std::io::Result<Daemon> {
        Daemon::start_in(name, spec, Some(sandbox))
    }

    fn start_in(name: &str, spec: Spec, sandbox: Option<Sandbox>) -> std::io::Result<Daemon> {
        let first = spawn(&spec, sandbox.as_ref())?;
        let pid = first.id() as i32;
        Daemon::watch(name, spec, sandbox, Watched::Child(first), pid, 1)
    }

    /// The daemon a former agent started with `spec` (its kept identity), when it still
    /// runs: supervised from now on as if started here (restarted in `sandbox` when it
    /// dies). A kept daemon started with another spec is stale: it is ended here. None
    /// when there is none to adopt; the caller starts one.
    pub fn adopt(name: &str, spec: &Spec, sandbox: Option<Sandbox>) -> Option<Daemon> {
        let path = spec.record_path();
        let record = Record::read(&path)?;
        if !record.runs() {
            let _ = std::fs::remove_file(&path);
            return None;
        }
        if record.digest != spec.digest() {
            tracing::info!(daemon = %name, pid = record.pid, "a kept daemon runs another configuration: ending it");
            end(&record);
            let _ = std::fs::remove_file(&path);
            return None;
        }
        let fd = match pidfd(record.pid) {
            Ok(fd) => fd,
            Err(e) => {
                tracing::warn!(daemon = %name, pid = record.pid, error = %e, "cannot watch a kept daemon: ending it");
                end(&record);
                return None;
            }
        };
        // Ended between the check and the pidfd: the pid may be another's now.
        if !record.runs() {
            return None;
        }
        tracing::info!(daemon = %name, pid = record.pid, "adopted a daemon a former agent started");
        Daemon::watch(
            name,
            spec.clone(),
            sandbox,
            Watched::Adopted(fd),
            record.pid,
            0,
        )
        .ok()
    }

    fn watch(
        name: &str,
        spec: Spec,
        sandbox: Option<Sandbox>,
        first: Watched,
        pid: i32,
        starts: u32,
    ) -> std::io::Result<Daemon> {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            pid: AtomicI32::new(pid),
            starts: std::sync::atomic::AtomicU32::new(starts),
        });
        let thread = {
            let shared = shared.clone();
            let spec = spec.clone();
            let name = name.to_string();
            std::thread::Builder::new()
                .name(format!("supervise-{}", spec.program))
                .spawn(move || supervise(&name, &spec, sandbox.as_ref(), first, &shared))?
        };
        Ok(Daemon {
            spec,
            shared,
            thread: Some(thread),
        })
    }

    pub fn pid(&self) -> i32 {
        self.shared.pid.load(Ordering::SeqCst)
    }

    /// Whether the process runs now (it may be between a death and its restart).
    pub fn alive(&self) -> bool {
        let pid = self.pid();
        // SAFETY: signal 0 only checks that the process exists.
        pid > 0 && unsafe { libc::kill(pid, 0) } == 0 && !is_zombie(pid)
    }

    /// Times this agent started the process (0: adopted, and running since).
    pub fn starts(&self) -> u32 {
        self.shared.starts.load(Ordering::SeqCst)
    }

    /// SIGTERM, then SIGKILL after the grace period; returns once the process is gone,
    /// and forgets its identity.
    pub fn stop(mut self) {
        self.halt();
        let _ = std::fs::remove_file(self.spec.record_path());
    }

    fn halt(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let pid = self.pid();
        if pid > 0 {
            // SAFETY: the pid is the watched process's until its supervisor sees it end
            // and clears it (a child is not reaped before; an adopted one was verified).
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + STOP_GRACE;
        while let Some(t) = &self.thread {
            if t.is_finished() {
                break;
            }
            if Instant::now() > deadline {
                let pid = self.pid();
                if pid > 0 {
                    // SAFETY: as above.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Dropping a daemon leaves it running for the next agent to adopt (the agent is going
/// away): its supervisor no longer starts it again, so two supervisors never race.
impl Drop for Daemon {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }
}

/// SIGTERM to a recorded process that still runs, SIGKILL after the grace period; returns
/// once it has ended.
fn end(record: &Record) {
    let Ok(fd) = pidfd(record.pid) else {
        return;
    };
    if !record.runs() {
        return;
    }
    // SAFETY: the pidfd names exactly the recorded process, checked running above.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            libc::SIGTERM,
            0,
            0,
        )
    };
    let deadline = Instant::now() + STOP_GRACE;
    while record.runs() {
        if Instant::now() > deadline {
            // SAFETY: as above.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    libc::SIGKILL,
                    0,
                    0,
                )
            };
            wait_pidfd(&fd);
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Ends every daemon whose identity is kept under `dir` (any depth) and still runs, and
/// forgets them: the daemons of a cluster the node no longer has, which no agent of this
/// run started. munged last: the others authenticate through it while they stop.
pub fn end_kept_under(dir: &Path) {
    let mut records = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == RECORD_EXTENSION) {
                records.push(path);
            }
        }
    }
    records.sort_by_key(|p| {
        p.file_stem()
            .is_some_and(|s| s.to_string_lossy().starts_with("munge"))
    });
    for path in records {
        if let Some(record) = Record::read(&path) {
            end(&record);
        }
        let _ = std::fs::remove_file(&path);
    }
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

fn supervise(
    name: &str,
    spec: &Spec,
    sandbox: Option<&Sandbox>,
    mut watched: Watched,
    shared: &Shared,
) {
    loop {
        let status = watched.wait();
        shared.pid.store(0, Ordering::SeqCst);
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        tracing::warn!(daemon = %name, program = %spec.program, %status, "daemon died; starting it again");
        loop {
            std::thread::sleep(RESTART_AFTER);
            if shared.stop.load(Ordering::SeqCst) {
                return;
            }
            match spawn(spec, sandbox) {
                Ok(c) => {
                    shared.pid.store(c.id() as i32, Ordering::SeqCst);
                    shared.starts.fetch_add(1, Ordering::SeqCst);
                    watched = Watched::Child(c);
                    break;
                }
                Err(e) => {
                    tracing::error!(daemon = %name, error = %e, "cannot start the daemon again; retrying")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper(dir: &Path, config: &str) -> Spec {
        Spec {
            program: "sleep".into(),
            args: vec!["300".into()],
            env: Vec::new(),
            log: dir.join("sleeper.out"),
            config: config.into(),
        }
    }

    fn runs(pid: i32) -> bool {
        pid > 0 && !is_zombie(pid)
    }

    fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_dropped_daemon_runs_on_and_the_next_agent_adopts_it() {
        let dir = tempfile::tempdir().unwrap();
        let spec = sleeper(dir.path(), "a");
        let first = Daemon::start("sleeper", spec.clone()).unwrap();
        let pid = first.pid();
        // The agent goes away without stopping it (a crash, an upgrade).
        drop(first);
        assert!(runs(pid), "the daemon outlives its supervisor");
        let record = Record::read(&spec.record_path()).unwrap();
        assert_eq!(record.pid, pid);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(spec.record_path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        let adopted = Daemon::adopt("sleeper", &spec, None).expect("adopted");
        assert_eq!(adopted.pid(), pid, "the same process");
        assert_eq!(adopted.starts(), 0, "adopted, not started");
        assert!(adopted.alive());
        adopted.stop();
        assert!(!runs(pid), "stop ends an adopted daemon");
        assert!(!spec.record_path().exists(), "and forgets it");
        assert!(Daemon::adopt("sleeper", &spec, None).is_none());
    }

    #[test]
    fn an_adopted_daemon_that_dies_is_started_again() {
        let dir = tempfile::tempdir().unwrap();
        let spec = sleeper(dir.path(), "a");
        let pid = Daemon::start("sleeper", spec.clone()).unwrap().pid();
        let adopted = Daemon::adopt("sleeper", &spec, None).unwrap();
        // SAFETY: kill only sends a signal, to the process this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        wait_until("the daemon started again", || {
            adopted.pid() > 0 && adopted.pid() != pid
        });
        assert_eq!(adopted.starts(), 1);
        assert_eq!(
            Record::read(&spec.record_path()).unwrap().pid,
            adopted.pid()
        );
        adopted.stop();
    }

    #[test]
    fn a_kept_daemon_with_another_configuration_is_ended_not_adopted() {
        let dir = tempfile::tempdir().unwrap();
        let pid = Daemon::start("sleeper", sleeper(dir.path(), "old"))
            .unwrap()
            .pid();
        let new = sleeper(dir.path(), "new");
        assert!(Daemon::adopt("sleeper", &new, None).is_none());
        assert!(!runs(pid), "the stale daemon ended");
        assert!(!new.record_path().exists());
    }

    #[test]
    fn a_record_whose_process_is_gone_or_another_adopts_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let spec = sleeper(dir.path(), "a");
        // Our own pid, with another start time: a pid reused by another process.
        let me = std::process::id() as i32;
        Record {
            pid: me,
            started: start_time(me).unwrap() + 1,
            digest: spec.digest(),
        }
        .write(&spec.record_path())
        .unwrap();
        assert!(Daemon::adopt("sleeper", &spec, None).is_none());
        assert!(!spec.record_path().exists());
        for garbage in ["", "12", "1 2 3", "x 2 d", "99 2 d extra"] {
            std::fs::write(spec.record_path(), garbage).unwrap();
            assert!(
                Daemon::adopt("sleeper", &spec, None).is_none(),
                "{garbage:?}"
            );
        }
    }

    #[test]
    fn kept_daemons_under_a_folder_end_together() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("ctld");
        std::fs::create_dir_all(&nested).unwrap();
        let a = Daemon::start("a", sleeper(dir.path(), "a")).unwrap().pid();
        let b = Daemon::start("b", sleeper(&nested, "b")).unwrap().pid();
        end_kept_under(dir.path());
        assert!(!runs(a) && !runs(b));
        assert!(!sleeper(&nested, "b").record_path().exists());
    }
}
