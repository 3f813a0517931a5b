//! One `gpufleet-agent serve` process with its own data dir, admin token and port.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::binaries;
use crate::grpc::Clients;
use crate::netns::{Host, Launcher};
use crate::pki::ServerTls;

/// What `serve` prints on stdout once it accepts connections.
const LISTENING_PREFIX: &str = "gpufleet-agent listening on ";
/// How long a restart waits for its port to be free again.
const PORT_REUSE_LIMIT: Duration = Duration::from_secs(30);

/// A safety net for a backend that never gets to listen (a hang, not a slow start):
/// startup takes well under a second.
const STARTUP_LIMIT: Duration = Duration::from_secs(60);

/// A clean shutdown on SIGTERM finishes in well under a second; past this it is a bug.
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(30);

/// The simulated hardware's fault file, read by the agent from its data dir.
pub const SIM_FAULTS_FILE: &str = "sim-faults.toml";

pub struct Backend {
    child: Option<Child>,
    /// Holds the data dir and the agent's log; removed on drop.
    root: tempfile::TempDir,
    admin_token: String,
    /// `host:port` the agent listens on; kept across restarts.
    address: String,
    /// The `--fleet` file, when the test describes its own fleet.
    fleet_file: Option<PathBuf>,
    /// Served over TLS with this certificate (written to `--tls-cert`/`--tls-key` files).
    tls: Option<ServerTls>,
    /// What node agents present to join (GPUFLEET_JOIN_TOKEN); empty: serve generates
    /// `<data-dir>/join.token` and may rotate it.
    join_token: String,
    /// More `serve` flags (e.g. `--node-agents external`).
    extra_args: Vec<String>,
    /// The multi-host tier: the host `serve` runs on, and the host the harness's own
    /// clients connect from (None: this machine, over loopback).
    host: Option<Launcher>,
    dial_from: Option<Launcher>,
    /// The data dir, relative to `root` ("data" unless a test asks for a long one).
    data_subdir: PathBuf,
}

impl Backend {
    /// Starts the agent on a free port (`--listen 127.0.0.1:0`) with a fresh data dir and a
    /// generated admin token, and waits for its listening line.
    pub fn start() -> Backend {
        Backend::launch(None, None)
    }

    /// Like [`Backend::start`], with the fleet `fleet_toml` describes (`[[pool]]` and
    /// `[[on_demand]]` groups, passed as `--fleet`) instead of the default one.
    pub fn start_with_fleet(fleet_toml: &str) -> Backend {
        Backend::launch(Some(fleet_toml), None)
    }

    /// Like [`Backend::start_with_fleet`], with more `serve` flags.
    pub fn start_with_fleet_and_args(fleet_toml: &str, args: &[&str]) -> Backend {
        Backend::launch_with(Some(fleet_toml), None, args)
    }

    /// Like [`Backend::start`], serving over TLS (`--tls-cert`/`--tls-key`) with `tls`'s
    /// certificate; [`Backend::endpoint`] is then `https://` and the harness's clients trust
    /// `tls.ca_pem`.
    pub fn start_with_tls(tls: &ServerTls) -> Backend {
        Backend::launch(None, Some(tls.clone()))
    }

    /// Like [`Backend::start`], with more `serve` flags.
    pub fn start_with_args(args: &[&str]) -> Backend {
        Backend::launch_with(None, None, args)
    }

    /// Like [`Backend::start_with_tls`], with more `serve` flags (e.g. `--agent-ca`).
    pub fn start_with_tls_and_args(tls: &ServerTls, args: &[&str]) -> Backend {
        Backend::launch_with(None, Some(tls.clone()), args)
    }

    /// Like [`Backend::start_with_args`], with no join token given: serve generates its
    /// `<data-dir>/join.token` (then the admin can rotate it; read it with
    /// [`Backend::generated_join_token`]).
    pub fn start_generating_join_token(args: &[&str]) -> Backend {
        Backend::launch_in_with_join_token(None, None, args, None, String::new())
    }

    /// The join token serve generated (see [`Backend::start_generating_join_token`]), as
    /// its data dir holds it now.
    pub fn generated_join_token(&self) -> String {
        fs::read_to_string(self.data_file("join.token"))
            .expect("the control plane's join.token")
            .trim()
            .to_string()
    }

    /// Replaces the certificate and key serve was started with, in place, as an operator
    /// renewing them would (serve reloads them; a restart keeps them).
    pub fn renew_tls(&mut self, tls: ServerTls) {
        let (cert, key) = self.tls_paths();
        fs::write(&cert, &tls.cert_pem).expect("write the TLS certificate");
        fs::write(&key, &tls.key_pem).expect("write the TLS key");
        self.tls = Some(tls);
    }

    fn tls_paths(&self) -> (PathBuf, PathBuf) {
        (
            self.root.path().join("tls-cert.pem"),
            self.root.path().join("tls-key.pem"),
        )
    }

    /// A control plane whose fleet is the node agents that register (`--node-agents
    /// external`), declaring a node unreachable after `node_timeout` without heartbeats and
    /// replacing it `replace_after` later (e.g. "1s").
    pub fn start_external(node_timeout: &str, replace_after: &str) -> Backend {
        Backend::start_with_args(&[
            "--node-agents",
            "external",
            "--node-timeout",
            node_timeout,
            "--replace-after",
            replace_after,
        ])
    }

    /// One replica of several on one database (issue 41): `serve` with `args` (its
    /// `--postgres` flags) and the admin and join tokens every replica shares, on a free
    /// port it keeps across restarts.
    pub fn start_replica(admin_token: &str, join_token: &str, args: &[&str]) -> Backend {
        Backend::launch_as(
            None,
            None,
            args,
            None,
            join_token.to_string(),
            admin_token.to_string(),
        )
    }

    /// The multi-host tier: `serve` on host `on` (its data dir in that host's dir),
    /// listening on the host's address (plain http, so `--insecure`) with `args`; the
    /// harness's clients ([`Backend::admin`]) connect from host `dial_from`.
    pub fn start_on(on: &Host, dial_from: &Host, args: &[&str]) -> Backend {
        Backend::start_sharing_on(
            on,
            dial_from,
            &generate_token("admin"),
            &generate_token("join"),
            args,
        )
    }

    /// Like [`Backend::start_on`], with the admin and join tokens of its fellow replicas
    /// (issue 41: several replicas on one database).
    pub fn start_sharing_on(
        on: &Host,
        dial_from: &Host,
        admin_token: &str,
        join_token: &str,
        args: &[&str],
    ) -> Backend {
        let root = tempfile::Builder::new()
            .prefix("gpufleet-backend-")
            .tempdir_in(on.dir())
            .expect("create temp dir for the backend");
        let mut extra = vec!["--insecure".to_string()];
        extra.extend(args.iter().map(|a| a.to_string()));
        let mut backend = Backend {
            child: None,
            root,
            admin_token: admin_token.to_string(),
            address: format!("{}:0", on.addr()),
            fleet_file: None,
            tls: None,
            join_token: join_token.to_string(),
            extra_args: extra,
            host: Some(on.launcher()),
            dial_from: Some(dial_from.launcher()),
            data_subdir: PathBuf::from("data"),
        };
        backend.spawn();
        backend
    }

    /// Like [`Backend::start_with_fleet_and_args`], with a data dir whose path is at least
    /// `chars` characters long (users keep clones in long paths).
    pub fn start_with_fleet_in_long_dir(fleet_toml: &str, args: &[&str], chars: usize) -> Backend {
        Backend::launch_in(Some(fleet_toml), None, args, Some(chars))
    }

    fn launch(fleet_toml: Option<&str>, tls: Option<ServerTls>) -> Backend {
        Backend::launch_with(fleet_toml, tls, &[])
    }

    fn launch_with(fleet_toml: Option<&str>, tls: Option<ServerTls>, extra: &[&str]) -> Backend {
        Backend::launch_in(fleet_toml, tls, extra, None)
    }

    fn launch_in(
        fleet_toml: Option<&str>,
        tls: Option<ServerTls>,
        extra: &[&str],
        long: Option<usize>,
    ) -> Backend {
        Backend::launch_in_with_join_token(fleet_toml, tls, extra, long, generate_token("join"))
    }

    fn launch_in_with_join_token(
        fleet_toml: Option<&str>,
        tls: Option<ServerTls>,
        extra: &[&str],
        long: Option<usize>,
        join_token: String,
    ) -> Backend {
        Backend::launch_as(
            fleet_toml,
            tls,
            extra,
            long,
            join_token,
            generate_token("admin"),
        )
    }

    fn launch_as(
        fleet_toml: Option<&str>,
        tls: Option<ServerTls>,
        extra: &[&str],
        long: Option<usize>,
        join_token: String,
        admin_token: String,
    ) -> Backend {
        let root = tempfile::Builder::new()
            .prefix("gpufleet-backend-")
            .tempdir()
            .expect("create temp dir for the backend");
        let base = root.path().display().to_string().len() + "/data".len();
        let data_subdir = match long {
            Some(chars) if chars > base => PathBuf::from(
                "a-long-directory-name".repeat(chars / 21 + 1)[..chars - base].to_string(),
            )
            .join("data"),
            _ => PathBuf::from("data"),
        };
        fs::create_dir_all(root.path().join(&data_subdir)).expect("create data dir");
        let fleet_file = fleet_toml.map(|toml| {
            let path = root.path().join("fleet.toml");
            fs::write(&path, toml).expect("write the fleet file");
            path
        });
        let mut backend = Backend {
            child: None,
            root,
            admin_token,
            address: "127.0.0.1:0".to_string(),
            fleet_file,
            tls,
            join_token,
            extra_args: extra.iter().map(|a| a.to_string()).collect(),
            host: None,
            dial_from: None,
            data_subdir,
        };
        backend.spawn();
        backend
    }

    /// `http://host:port` (`https://` with TLS), as the provider's `endpoint` takes it.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.address)
    }

    /// The CA certificate (PEM) clients must trust; `None` when serving plain http.
    pub fn ca_cert_pem(&self) -> Option<&str> {
        self.tls.as_ref().map(|tls| tls.ca_pem.as_str())
    }

    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    pub fn join_token(&self) -> &str {
        &self.join_token
    }

    /// Kills the control plane with SIGKILL (no shutdown at all), as a crash would.
    pub fn crash(&mut self) {
        self.kill();
    }

    /// Starts the control plane again on the same data dir, tokens and address.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "the backend is still running");
        self.spawn();
    }

    /// The serving process's id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.root.path().join(&self.data_subdir)
    }

    pub fn log_path(&self) -> PathBuf {
        self.root.path().join("agent.log")
    }

    /// The agent's stderr so far (its structured log), for failure messages.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// gRPC clients that act as the admin.
    pub async fn admin(&self) -> Clients {
        self.clients(&self.admin_token).await
    }

    /// gRPC clients that act with `token` (e.g. a tenant's).
    pub async fn clients(&self, token: &str) -> Clients {
        if let Some(from) = &self.dial_from {
            return Clients::connect_from(from, &self.endpoint(), token).await;
        }
        Clients::connect_with_ca(&self.endpoint(), token, self.ca_cert_pem()).await
    }

    /// The host the harness's clients connect from (multi-host tier only).
    pub fn dial_from(&self) -> Option<&Launcher> {
        self.dial_from.as_ref()
    }

    /// Stops the agent with SIGTERM (a clean shutdown), then starts it again on the same
    /// data dir, admin token and address.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Stops the control plane with SIGTERM (a clean shutdown) and waits for its exit; it
    /// can be started again with [`Backend::start_again`].
    pub fn terminate(&mut self) {
        self.stop();
    }

    /// Like [`Backend::restart`], with `args` as its more `serve` flags from now on (e.g.
    /// another `--advertise-address`).
    pub fn restart_with_args(&mut self, args: &[&str]) {
        self.stop();
        self.extra_args = args.iter().map(|a| a.to_string()).collect();
        self.spawn();
    }

    /// Makes the simulated hardware fail as `toml` says (e.g. `fail_create_after = 1`).
    pub fn write_sim_faults(&self, toml: &str) {
        let path = self.data_dir().join(SIM_FAULTS_FILE);
        fs::write(&path, toml).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// Removes the simulated hardware's fault file.
    pub fn clear_sim_faults(&self) {
        let path = self.data_dir().join(SIM_FAULTS_FILE);
        if path.exists() {
            fs::remove_file(&path).unwrap_or_else(|e| panic!("remove {}: {e}", path.display()));
        }
    }

    /// Starts `serve`. A restart keeps the address, and while the process was down another
    /// connection may have taken its port as an ephemeral one: a start refused for a port
    /// in use is tried again until the port is free (at most [`PORT_REUSE_LIMIT`]).
    fn spawn(&mut self) {
        let deadline = Instant::now() + PORT_REUSE_LIMIT;
        loop {
            let log_before = self.log().len();
            match self.spawn_once() {
                Ok(address) => {
                    self.address = address;
                    return;
                }
                Err(status) => {
                    let log = self.log();
                    let this_start = &log[log_before.min(log.len())..];
                    let port_taken = this_start.contains("Address already in use")
                        || this_start.contains("address already in use");
                    if !(port_taken && Instant::now() < deadline) {
                        panic!(
                            "gpufleet-agent exited ({status:?}) before printing {LISTENING_PREFIX:?}\n--- agent log ---\n{log}"
                        );
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    fn spawn_once(&mut self) -> Result<String, Option<std::process::ExitStatus>> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open agent log");
        let mut command = match &self.host {
            Some(host) => host.daemon(binaries::agent()),
            None => Command::new(binaries::agent()),
        };
        command.arg("serve");
        if let Some(fleet) = &self.fleet_file {
            command.arg("--fleet").arg(fleet);
        }
        if let Some(tls) = &self.tls {
            let (cert, key) = self.tls_paths();
            fs::write(&cert, &tls.cert_pem).expect("write the TLS certificate");
            fs::write(&key, &tls.key_pem).expect("write the TLS key");
            command
                .arg("--tls-cert")
                .arg(cert)
                .arg("--tls-key")
                .arg(key);
        }
        command
            .arg("--listen")
            .arg(&self.address)
            .arg("--data-dir")
            .arg(self.data_dir())
            // Tokens in the environment, never on the command line: any local user (a
            // tenant's job on a node of this host) reads every process's command line.
            .env("GPUFLEET_ADMIN_TOKEN", &self.admin_token)
            .args(&self.extra_args)
            .env_remove("GPUFLEET_NODE_AGENTS")
            .env_remove("GPUFLEET_FLEET")
            .env_remove("GPUFLEET_TLS_CERT")
            .env_remove("GPUFLEET_TLS_KEY")
            // Short bandwidth tests in acceptance checks keep the suite fast (a test's own
            // --bandwidth-duration wins).
            .env("GPUFLEET_BANDWIDTH_DURATION", "200ms")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        if self.join_token.is_empty() {
            command.env_remove("GPUFLEET_JOIN_TOKEN");
        } else {
            command.env("GPUFLEET_JOIN_TOKEN", &self.join_token);
        }
        let mut child = match &self.host {
            Some(host) => host.spawn(&mut command),
            None => command.spawn(),
        }
        .expect("spawn gpufleet-agent serve");
        let stdout = child.stdout.take().expect("piped stdout");
        self.child = Some(child);
        self.wait_for_listening_line(stdout)
    }

    /// Reads stdout until the listening line and returns its `host:port`, or the exit
    /// status of a process that ended first. A thread keeps draining stdout afterwards so
    /// the agent never blocks on a full pipe.
    fn wait_for_listening_line(
        &mut self,
        stdout: std::process::ChildStdout,
    ) -> Result<String, Option<std::process::ExitStatus>> {
        let (lines_tx, lines_rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // The receiver stops listening after the listening line; keep draining.
                let _ = lines_tx.send(line);
            }
        });
        loop {
            match lines_rx.recv_timeout(STARTUP_LIMIT) {
                Ok(line) => {
                    if let Some(url) = line.trim().strip_prefix(LISTENING_PREFIX) {
                        let url = url.trim();
                        let address = url.split_once("://").map_or(url, |(_, rest)| rest);
                        return Ok(address.trim_end_matches('/').to_string());
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.take().and_then(|mut c| c.wait().ok());
                    return Err(status);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    self.kill();
                    panic!(
                        "gpufleet-agent did not print {LISTENING_PREFIX:?} within {STARTUP_LIMIT:?}\n--- agent log ---\n{}",
                        self.log()
                    );
                }
            }
        }
    }

    /// SIGTERM, then wait for the exit. A backend that is still running after
    /// [`SHUTDOWN_LIMIT`] has a shutdown bug: it is killed and the test fails with its log.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let signalled = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        assert!(
            matches!(signalled, Ok(s) if s.success()),
            "could not send SIGTERM to gpufleet-agent: {signalled:?}"
        );
        let deadline = Instant::now() + SHUTDOWN_LIMIT;
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "gpufleet-agent did not exit within {SHUTDOWN_LIMIT:?} of SIGTERM\n--- agent log ---\n{}",
                        self.log()
                    );
                }
            }
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Path of a file in the data dir (for assertions on what the agent wrote).
    pub fn data_file(&self, name: impl AsRef<Path>) -> PathBuf {
        self.data_dir().join(name)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.kill();
        // The accounts and runtime dirs of Slurm clusters the test did not destroy.
        gpufleet_slurm::leftovers::forget_all_under(&self.data_dir());
    }
}

/// A token nobody can guess within a test run: `prefix-` and 32 hex digits from the
/// process's random hash keys.
pub fn generate_token(prefix: &str) -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut hex = String::new();
    for _ in 0..2 {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        hex.push_str(&format!("{:016x}", hasher.finish()));
    }
    format!("{prefix}-{hex}")
}

/// Prints the backend's log when the test fails while it is alive: `let _log =
/// LogOnPanic(&backend);`.
pub struct LogOnPanic<'a>(pub &'a Backend);

impl Drop for LogOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("BACKEND LOG:\n{}", self.0.log());
        }
    }
}
