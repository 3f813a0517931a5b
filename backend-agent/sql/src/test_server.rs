//! A throwaway PostgreSQL server for tests: Debian's `initdb` and `postgres` (installed by
//! `scripts/bootstrap.sh`), its own data dir in a temporary folder, its own port on
//! loopback, no Unix socket, a random password, and stopped when dropped (or when the
//! thread that started it dies, should the test process be killed). PostgreSQL refuses to
//! run as root, so as root it runs as Debian's `postgres` user. A test may crash it and
//! start it again ([`TestServer::crash_and_restart`]).

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a server may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The superuser tests connect as.
const USER: &str = "gpufleet";

/// A running server; stopped (immediate shutdown) and its files removed on drop.
pub struct TestServer {
    dir: tempfile::TempDir,
    child: Child,
    /// The thread the server was spawned from, kept until the server is stopped.
    _keeper: Keeper,
    port: u16,
    password: String,
}

/// Ends the thread a server was spawned from when dropped. The server dies with that
/// thread (`PR_SET_PDEATHSIG` follows the spawning thread, not the process), so it is one
/// of its own rather than whichever thread called: a tokio blocking thread ends when idle.
struct Keeper {
    _stop: mpsc::Sender<()>,
}

/// Spawns the server from a thread of its own that lives until the [`Keeper`] is dropped.
fn spawn_kept(
    bin: &Path,
    data: &Path,
    dir: &Path,
    port: u16,
    owner: Option<(u32, u32)>,
) -> Result<(Child, Keeper), String> {
    let (bin, data, dir) = (bin.to_path_buf(), data.to_path_buf(), dir.to_path_buf());
    let (spawned_tx, spawned) = mpsc::channel();
    let (keeper, stop) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("postgres-keeper".into())
        .spawn(move || {
            let result = spawn(&bin, &data, &dir, port, owner);
            let started = result.is_ok();
            let _ = spawned_tx.send(result);
            if started {
                // Until the Keeper's sender is dropped.
                let _ = stop.recv();
            }
        })
        .map_err(|e| format!("a thread for postgres: {e}"))?;
    let child = spawned
        .recv()
        .map_err(|_| "the postgres thread ended".to_string())??;
    Ok((child, Keeper { _stop: keeper }))
}

impl TestServer {
    /// Starts a server, or says what is missing.
    pub fn start() -> Result<Self, String> {
        let bin = bin_dir()?;
        let owner = owner()?;
        let dir = tempfile::Builder::new()
            .prefix("gpufleet-pg-")
            .tempdir()
            .map_err(|e| format!("a temporary folder: {e}"))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .map_err(|e| format!("chown {}: {e}", dir.path().display()))?;
        }
        let password = random_hex(16)?;
        let pwfile = dir.path().join("pwfile");
        std::fs::write(&pwfile, &password).map_err(|e| format!("{}: {e}", pwfile.display()))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&pwfile, Some(uid), Some(gid)).map_err(|e| e.to_string())?;
        }
        let data = dir.path().join("data");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                USER,
                "--auth=scram-sha-256",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ])
            .arg(format!("--pwfile={}", pwfile.display()));
        as_owner(&mut initdb, owner);
        let out = initdb.output().map_err(|e| format!("initdb: {e}"))?;
        let _ = std::fs::remove_file(&pwfile);
        if !out.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        // A port the kernel just gave out is free unless another process takes it between
        // here and the server's bind; the server then fails to start, and we try another.
        let mut last = String::new();
        for _ in 0..3 {
            let port = free_port()?;
            match spawn_kept(&bin, &data, dir.path(), port, owner) {
                Ok((child, keeper)) => {
                    let mut server = TestServer {
                        dir,
                        child,
                        _keeper: keeper,
                        port,
                        password,
                    };
                    return match server.wait_ready() {
                        Ok(()) => Ok(server),
                        Err(e) => Err(e),
                    };
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The superuser's address of database `name` (`postgres` always exists).
    pub fn url(&self, name: &str) -> String {
        format!(
            "postgres://{USER}:{}@127.0.0.1:{}/{name}?connect_timeout=10",
            self.password, self.port
        )
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A new empty database of its own, by its address.
    pub fn database(&self, name: &str) -> Result<String, String> {
        let mut admin = postgres::Client::connect(&self.url("postgres"), postgres::NoTls)
            .map_err(|e| format!("connecting to the test server: {e}"))?;
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .map_err(|e| format!("CREATE DATABASE {name}: {e}"))?;
        Ok(self.url(name))
    }

    /// Serves TLS beside plain connections, with the PEM certificate `cert` and key `key`
    /// (written into the data dir, the key readable by the server only).
    pub fn enable_tls(&self, cert: &str, key: &str) -> Result<(), String> {
        let data = self.dir.path().join("data");
        let owner = owner()?;
        for (name, text) in [("server.crt", cert), ("server.key", key)] {
            let path = data.join(name);
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .map_err(|e| format!("{}: {e}", path.display()))?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                    .map_err(|e| format!("chown {}: {e}", path.display()))?;
            }
        }
        let mut admin = postgres::Client::connect(&self.url("postgres"), postgres::NoTls)
            .map_err(|e| format!("connecting to the test server: {e}"))?;
        // Two calls: ALTER SYSTEM runs outside a transaction, and a batch is one.
        for sql in ["ALTER SYSTEM SET ssl = 'on'", "SELECT pg_reload_conf()"] {
            admin
                .batch_execute(sql)
                .map_err(|e| format!("turning TLS on ({sql}): {}", crate::error::Error::from(e)))?;
        }
        // The reload is the postmaster's, after the call returns.
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let on = postgres::Client::connect(&self.url("postgres"), postgres::NoTls)
                .and_then(|mut c| c.query_one("SHOW ssl", &[]))
                .map(|row| row.get::<_, String>(0) == "on")
                .unwrap_or(false);
            if on {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("TLS never came on\n{}", self.log()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// Kills the server as a crash of its machine's processes would (SIGKILL to the
    /// postmaster and every backend, no shutdown), then starts it again on the same data
    /// dir and port. Its crash recovery replays the WAL: every commit it acknowledged is
    /// there again (written to the WAL before the commit answered; with `fsync=off` only
    /// a crash of the machine itself could lose it).
    pub fn crash_and_restart(&mut self) -> Result<(), String> {
        let postmaster = self.child.id();
        let backends = children_of(postmaster);
        for pid in std::iter::once(postmaster).chain(backends.iter().copied()) {
            // SAFETY: kill(2) on the server's own processes.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
        let _ = self.child.wait();
        let (bin, owner) = (bin_dir()?, owner()?);
        let data = self.dir.path().join("data");
        // A new postmaster refuses to start while a backend of the old one still holds
        // its shared memory; the backends are gone a moment after their SIGKILL.
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let started = spawn_kept(&bin, &data, self.dir.path(), self.port, owner).and_then(
                |(child, keeper)| {
                    self.child = child;
                    self._keeper = keeper;
                    self.wait_ready()
                },
            );
            match started {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("restarting after the crash: {e}"))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Waits until the server accepts a connection, or says why it did not (also when it
    /// exited).
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "the test PostgreSQL server exited ({status})\n{}",
                    self.log()
                ));
            }
            match postgres::Client::connect(&self.url("postgres"), postgres::NoTls) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(format!(
                        "the test PostgreSQL server did not accept connections in {START_TIMEOUT:?}: {e}\n{}",
                        self.log()
                    ))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        // SIGQUIT: immediate shutdown, the backends with it; the data is thrown away.
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGQUIT);
        }
        let _ = self.child.wait();
    }
}

fn spawn(
    bin: &Path,
    data: &Path,
    dir: &Path,
    port: u16,
    owner: Option<(u32, u32)>,
) -> Result<Child, String> {
    // Appended to: a restarted server's log follows the one before the crash.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("server.log"))
        .map_err(|e| e.to_string())?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(dir.join("server.log"), Some(uid), Some(gid))
            .map_err(|e| e.to_string())?;
    }
    let mut cmd = Command::new(bin.join("postgres"));
    cmd.arg("-D")
        .arg(data)
        .arg("-p")
        .arg(port.to_string())
        // Loopback only, no socket file (clone paths may be long), and a test's data
        // need not survive a crash of the machine.
        .args([
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "unix_socket_directories=",
            "-c",
            "fsync=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=100",
            "-c",
            "shared_buffers=32MB",
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    as_owner(&mut cmd, owner);
    // SAFETY: prctl in the child before exec, async-signal-safe. The server dies with the
    // thread that started it (its `Keeper`'s), should the test process be killed before
    // its drop.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGQUIT);
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| format!("postgres: {e}"))?;
    // A server that could not bind its port exits at once.
    std::thread::sleep(Duration::from_millis(20));
    if let Ok(Some(status)) = child.try_wait() {
        let mut text = String::new();
        let _ = std::fs::File::open(dir.join("server.log"))
            .and_then(|mut f| f.read_to_string(&mut text));
        return Err(format!("postgres exited ({status}): {}", text.trim()));
    }
    Ok(child)
}

/// The processes whose parent is `pid` (from /proc): a postmaster's backends.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let child: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == pid).then_some(child)
        })
        .collect()
}

fn as_owner(cmd: &mut Command, owner: Option<(u32, u32)>) {
    if let Some((uid, gid)) = owner {
        cmd.uid(uid).gid(gid);
    }
}

/// The newest of Debian's PostgreSQL versions installed.
fn bin_dir() -> Result<PathBuf, String> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| missing())?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).ok_or_else(missing)
}

fn missing() -> String {
    "PostgreSQL is not installed: no /usr/lib/postgresql/*/bin/initdb (Debian's postgresql; \
     scripts/bootstrap.sh installs it)"
        .to_string()
}

/// As root, Debian's `postgres` user's uid and gid; otherwise none (we run it as ourselves).
fn owner() -> Result<Option<(u32, u32)>, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(|e| format!("/etc/passwd: {e}"))?;
    passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.first() == Some(&"postgres"))
        .and_then(|f| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))
        .map(Some)
        .ok_or_else(|| {
            "as root, PostgreSQL runs as Debian's postgres user, and there is none \
             (scripts/bootstrap.sh installs postgresql)"
                .to_string()
        })
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("a free port: {e}"))?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

fn random_hex(bytes: usize) -> Result<String, String> {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| format!("/dev/urandom: {e}"))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}
