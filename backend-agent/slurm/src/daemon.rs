//! One supervised daemon process (slurmctld, slurmd or munged), run in the foreground by a
//! thread of its own that restarts it when it dies, until it is stopped.
//!
//! The daemon gets SIGTERM when its supervising thread ends (PR_SET_PDEATHSIG), so a
//! control plane or node agent that dies leaves no Slurm or munge process behind; that
//! is why each daemon has a dedicated thread that lives exactly as long as it should.
//! A daemon that serves a tenant (a login's sshd, a node's slurmd) runs in a
//! [`Sandbox`]: a mount namespace of its own, entered between fork and exec.
//!
//! Everything here blocks: async callers go through spawn_blocking.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::sandbox::Sandbox;

/// How long a stopped daemon gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Pause before a daemon that died is started again.
const RESTART_AFTER: Duration = Duration::from_millis(500);

/// What to run: the program, its arguments, and where its stdout/stderr go.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub log: PathBuf,
}

struct Shared {
    stop: AtomicBool,
    pid: AtomicI32,
    /// Times the process was started (1 + restarts).
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
    // SAFETY: prctl and setpgid are async-signal-safe and touch only the child's own state.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Its own process group: a signal to the parent's group (Ctrl-C) does not reach it
            // before the supervisor stops it in order.
            libc::setpgid(0, 0);
            match &prepared {
                Some(p) => p.enter(),
                None => Ok(()),
            }
        });
    }
    cmd.spawn()
}

impl Daemon {
    /// Starts the process now (an error when it cannot be spawned at all) and supervises it.
    /// The supervising thread spawns it, so that the death signal follows that thread's
    /// life (PR_SET_PDEATHSIG fires when the *thread* that forked the child ends), not the
    /// caller's, which may be a pooled thread that ends when idle.
    pub fn start(name: &str, spec: Spec) -> std::io::Result<Daemon> {
        Daemon::start_in(name, spec, None)
    }

    /// [`Daemon::start`] in `sandbox` (each restart too).
    pub fn start_sandboxed(name: &str, spec: Spec, sandbox: Sandbox) -> std::io::Result<Daemon> {
        Daemon::start_in(name, spec, Some(sandbox))
    }

    fn start_in(name: &str, spec: Spec, sandbox: Option<Sandbox>) -> std::io::Result<Daemon> {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            pid: AtomicI32::new(0),
            starts: std::sync::atomic::AtomicU32::new(1),
        });
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let thread = {
            let shared = shared.clone();
            let spec = spec.clone();
            let name = name.to_string();
            std::thread::Builder::new()
                .name(format!("supervise-{}", spec.program))
                .spawn(move || match spawn(&spec, sandbox.as_ref()) {
                    Ok(first) => {
                        shared.pid.store(first.id() as i32, Ordering::SeqCst);
                        let _ = started_tx.send(Ok(()));
                        supervise(&name, &spec, sandbox.as_ref(), first, &shared);
                    }
                    Err(e) => {
                        let _ = started_tx.send(Err(e));
                    }
                })?
        };
        match started_rx.recv() {
            Ok(Ok(())) => Ok(Daemon {
                spec,
                shared,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(std::io::Error::other("the supervising thread ended")),
        }
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

    pub fn starts(&self) -> u32 {
        self.shared.starts.load(Ordering::SeqCst)
    }

    /// SIGTERM, then SIGKILL after the grace period; returns once the process is gone.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let pid = self.pid();
        if pid > 0 {
            // SAFETY: the pid is our own child, not yet reaped (the supervisor reaps it).
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

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.halt();
        }
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
    mut child: std::process::Child,
    shared: &Shared,
) {
    loop {
        let status = child.wait();
        shared.pid.store(0, Ordering::SeqCst);
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        tracing::warn!(daemon = %name, program = %spec.program, status = ?status, "daemon died; starting it again");
        loop {
            std::thread::sleep(RESTART_AFTER);
            if shared.stop.load(Ordering::SeqCst) {
                return;
            }
            match spawn(spec, sandbox) {
                Ok(c) => {
                    shared.pid.store(c.id() as i32, Ordering::SeqCst);
                    shared.starts.fetch_add(1, Ordering::SeqCst);
                    child = c;
                    break;
                }
                Err(e) => {
                    tracing::error!(daemon = %name, error = %e, "cannot start the daemon again; retrying")
                }
            }
        }
    }
}
