//! One `gpufleet-agent node` process with simulated GPUs and its own data dir: a GPU host
//! as the control plane sees it, to register, kill (SIGKILL, as a host dies) and restart.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::binaries;
use crate::netns::{Host, Launcher};
use crate::Backend;

pub struct NodeAgent {
    child: Option<Child>,
    pub name: String,
    root: tempfile::TempDir,
    args: Vec<String>,
    /// Given in the environment, never on the command line (a tenant's job on this host
    /// reads every process's command line).
    join_token: String,
    /// The multi-host tier: the host the agent runs on (None: this machine).
    host: Option<Launcher>,
}

impl NodeAgent {
    /// Starts an agent named `name` that joins `backend` with its join token; `extra` adds
    /// flags (e.g. `--gpus 2`, `--capacity on-demand`).
    pub fn start(backend: &Backend, name: &str, extra: &[&str]) -> NodeAgent {
        Self::start_with_token(backend, name, backend.join_token(), extra)
    }

    /// Like [`NodeAgent::start`] with another join token (e.g. a forged one).
    pub fn start_with_token(
        backend: &Backend,
        name: &str,
        join_token: &str,
        extra: &[&str],
    ) -> NodeAgent {
        Self::launch(None, &backend.endpoint(), name, join_token, extra)
    }

    /// Like [`NodeAgent::start`], given `control_plane` as its `--control-plane` (e.g.
    /// several addresses, comma-separated) instead of the backend's endpoint.
    pub fn start_dialing(
        backend: &Backend,
        control_plane: &str,
        name: &str,
        extra: &[&str],
    ) -> NodeAgent {
        Self::launch(None, control_plane, name, backend.join_token(), extra)
    }

    /// The multi-host tier: an agent on `host` (its data dir in the host's dir) that
    /// reaches `backend` at its address. It is given no address flag: it offers its peers
    /// and the Slurm controller the host's address by default (the route to the control
    /// plane), as an operator who gives none would have it.
    pub fn start_on(host: &Host, backend: &Backend, name: &str, extra: &[&str]) -> NodeAgent {
        Self::launch(
            Some(host),
            &backend.endpoint(),
            name,
            backend.join_token(),
            extra,
        )
    }

    /// The multi-host tier with several control-plane replicas (issue 41): an agent on
    /// `host` given `control_plane` (every replica's address, comma-separated) and their
    /// join token.
    pub fn start_on_dialing(
        host: &Host,
        control_plane: &str,
        join_token: &str,
        name: &str,
        extra: &[&str],
    ) -> NodeAgent {
        Self::launch(Some(host), control_plane, name, join_token, extra)
    }

    fn launch(
        host: Option<&Host>,
        control_plane: &str,
        name: &str,
        join_token: &str,
        extra: &[&str],
    ) -> NodeAgent {
        let mut root = tempfile::Builder::new();
        let prefix = format!("gpufleet-node-{name}-");
        root.prefix(&prefix);
        let root = match host {
            Some(host) => root.tempdir_in(host.dir()),
            None => root.tempdir(),
        }
        .expect("create the node agent's temp dir");
        let mut args: Vec<String> = vec![
            "node".into(),
            "--control-plane".into(),
            control_plane.into(),
            "--name".into(),
            name.into(),
            "--data-dir".into(),
            root.path().join("data").display().to_string(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let mut agent = NodeAgent {
            child: None,
            name: name.to_string(),
            root,
            args,
            join_token: join_token.to_string(),
            host: host.map(Host::launcher),
        };
        agent.spawn();
        agent
    }

    fn spawn(&mut self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open the node agent's log");
        let mut command = match &self.host {
            Some(host) => host.daemon(binaries::agent()),
            None => Command::new(binaries::agent()),
        };
        // A process group of its own: what the agent runs while it works (mount, mkfs)
        // is in it, and `Drop` waits for that to end too (the Slurm daemons start
        // sessions of their own and are not).
        command.process_group(0);
        command
            .args(&self.args)
            .env("GPUFLEET_JOIN_TOKEN", &self.join_token)
            .env_remove("GPUFLEET_HARDWARE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let child = match &self.host {
            Some(host) => host.spawn(&mut command),
            None => command.spawn(),
        }
        .expect("spawn gpufleet-agent node");
        self.child = Some(child);
    }

    pub fn data_dir(&self) -> PathBuf {
        self.root.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.root.path().join("node.log")
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// SIGKILL: the host is gone, nothing is cleaned up. What the agent was running in
    /// its process group (a `mount`, an mkfs) goes with it, and is waited for: a mount
    /// that landed after this would be one no agent knows of. The Slurm daemons it
    /// started run on (sessions of their own), as they do when an agent dies.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let group = i32::try_from(child.id()).expect("a pid");
            // SAFETY: kill with a negative pid signals a process group; the group is
            // known to exist, its leader not yet reaped.
            unsafe { libc::kill(-group, libc::SIGKILL) };
            let _ = child.wait();
            wait_group_gone(group);
        }
    }

    /// The agent's pid (None once killed).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGSTOP: the agent holds its orders unanswered (and sends no heartbeats) until
    /// [`NodeAgent::resume`], e.g. to keep an operation under way for as long as a test needs.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT after [`NodeAgent::pause`].
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// SIGTERM: a planned stop (a service stop); [`NodeAgent::wait_exit`] sees it end.
    pub fn terminate(&self) {
        self.signal("-TERM");
    }

    fn signal(&self, which: &str) {
        let child = self.child.as_ref().expect("the agent runs");
        let ok = Command::new("kill")
            .arg(which)
            .arg(child.id().to_string())
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill {which} {}", child.id());
    }

    /// Like [`NodeAgent::restart`], with `extra` as its flags from now on (e.g. other
    /// `--cpus`).
    pub fn restart_with(&mut self, extra: &[&str]) {
        // The flags NodeAgent::start_with_token gives every agent come first.
        self.args.truncate(7);
        self.args.extend(extra.iter().map(|a| a.to_string()));
        self.restart();
    }

    /// Starts the agent again on the same data dir (its journal and simulated GPUs).
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// The exit status once the process has ended within `limit`; None while it runs.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().expect("poll the node agent") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn json(&self, file: &str) -> Option<Value> {
        let text = fs::read_to_string(self.data_dir().join(file)).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// The agent's own view of its node (`status.json`): registration and GPUs.
    pub fn status(&self) -> Option<Value> {
        self.json("status.json")
    }

    /// The agent's order journal (`orders.json`).
    pub fn journal(&self) -> Option<Value> {
        self.json("orders.json")
    }

    /// The driver the agent's own status reports.
    pub fn driver(&self) -> Option<String> {
        self.status()?["driver_version"]
            .as_str()
            .map(str::to_string)
    }

    /// MIG profiles per GPU, as the agent's own status reports them.
    pub fn profiles(&self) -> Vec<Vec<String>> {
        let Some(status) = self.status() else {
            return Vec::new();
        };
        status["gpus"]
            .as_array()
            .map(|gpus| {
                gpus.iter()
                    .map(|g| {
                        g["mig_devices"]
                            .as_array()
                            .map(|d| {
                                d.iter()
                                    .map(|d| d["profile"].as_str().unwrap_or_default().to_string())
                                    .collect()
                            })
                            .unwrap_or_default()
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        self.kill9();
        // The node-local team volumes of clusters the test did not destroy (or a failed
        // test left): `node --clean` unmounts them on the agent's host, and their loop
        // devices go with the mounts.
        if self.data_dir().join("volumes").exists() {
            let mut clean = match &self.host {
                Some(host) => host.command(binaries::agent()),
                None => Command::new(binaries::agent()),
            };
            let cleaned = clean
                .args(["node", "--clean", "--name", &self.name, "--data-dir"])
                .arg(self.data_dir())
                .stdin(Stdio::null())
                .output();
            match cleaned {
                Ok(out) if out.status.success() => {}
                other => eprintln!("node --clean of {}: {other:?}", self.name),
            }
        }
        // The accounts and runtime dirs of Slurm clusters the test did not destroy: the
        // agent ran their daemons (an agent of a namespace host made them in that host's
        // own /etc and /run, which go with the host).
        gpufleet_slurm::leftovers::forget_all_under(&self.data_dir());
    }
}

/// Waits, for at most 30 s, until no process of group `group` (all sent SIGKILL) runs:
/// one in a system call (mount(2)) ends when the call returns.
fn wait_group_gone(group: i32) {
    // SAFETY: signal 0 only asks whether the group has a process.
    let gone = || unsafe { libc::kill(-group, 0) } != 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !gone() {
        if Instant::now() > deadline {
            eprintln!("process group {group} of a node agent still runs 30 s after SIGKILL");
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `probe` until it returns Some, for at most `limit` (a safety net against a hang,
/// not a timing assertion); panics naming `what` when it never does.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "still waiting for {what} after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Like [`eventually`], for a thread that is not async (e.g. inside `std::thread::scope`).
pub fn wait_for<T>(what: &str, limit: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "still waiting for {what} after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}
