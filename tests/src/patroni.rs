//! A highly available PostgreSQL on the multi-host tier (issue 41): a cluster of Patroni
//! members on [`Network`] hosts, each a `patroni` running PostgreSQL as Debian's `postgres`
//! user, with Patroni's own Raft (python3-pysyncobj) as the DCS, so no other daemon runs.
//! Replication is synchronous (`synchronous_mode`): a commit the primary acknowledges is on
//! the synchronous standby too, which is the only member Patroni promotes.
//!
//! Clients reach the cluster with a libpq multi-host URL and `target_session_attrs=
//! read-write` ([`PatroniCluster::url`]): they try each member in turn and keep the one that
//! takes writes, so a failover needs no proxy. The same URL is what the `postgres` crate
//! (0.19) parses: several `host:port` separated by commas, and `read-write`.
//!
//! Every wait polls a condition against a deadline; a failure names the member and shows the
//! tail of its Patroni log (PostgreSQL's messages are in it too). Debian's packages are
//! installed by `scripts/bootstrap.sh` (`install_postgresql`, `install_patroni`); a missing
//! one fails the test naming it.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::netns::{Host, Network};

/// Patroni's REST API, PostgreSQL and Raft: the same ports on every host (each its own
/// network namespace).
const REST_PORT: u16 = 8008;
const PG_PORT: u16 = 5432;
const RAFT_PORT: u16 = 2222;

/// The superuser that clients and Patroni itself connect as, and the replication user.
const USER: &str = "gpufleet";
const REPLICATION_USER: &str = "replicator";

/// Bootstrap (initdb, then each replica's base backup) on a loaded machine.
const START_LIMIT: Duration = Duration::from_secs(120);
/// How long a killed member's processes may take to be gone.
const KILL_LIMIT: Duration = Duration::from_secs(10);
/// One REST call or connection attempt.
const PROBE_LIMIT: Duration = Duration::from_secs(2);
/// How often waits look again.
const POLL: Duration = Duration::from_millis(100);
/// Lines of a member's log a failure shows.
const LOG_TAIL: usize = 40;

/// A running cluster; every member's processes are killed on drop (the [`Network`]'s drop
/// kills whatever is left and removes the data).
pub struct PatroniCluster<'n> {
    members: Vec<Member<'n>>,
    password: String,
    pg_bin: PathBuf,
}

struct Member<'n> {
    host: &'n Host,
    /// The postgres-owned directory: config, data dir, Raft journal, socket dir.
    dir: PathBuf,
    /// Patroni's stdout and stderr (root-owned, beside `dir`).
    log: PathBuf,
    /// The `patroni` process, the harness's child; None while the member is killed.
    patroni: Option<Child>,
}

impl<'n> PatroniCluster<'n> {
    /// Starts one member on each of `hosts` (names in `net`) and waits until one is the
    /// primary, one its synchronous standby and the rest replicas.
    pub fn start(net: &'n Network, hosts: &[&str]) -> PatroniCluster<'n> {
        assert!(
            hosts.len() >= 2,
            "a Patroni cluster needs two members at least"
        );
        let pg_bin = require_packages();
        let (uid, gid) = postgres_owner();
        let password = random_hex(16);
        let hosts: Vec<&Host> = hosts.iter().map(|h| net.host(h)).collect();
        let addrs: Vec<Ipv4Addr> = hosts.iter().map(|h| h.addr()).collect();
        let mut members = Vec::new();
        for host in &hosts {
            let dir = host.dir().join("patroni");
            // The postgres user must reach its directory through the network's (root's 0700).
            for parent in [host.dir().parent().expect("the network's dir"), host.dir()] {
                set_mode(parent, 0o711);
            }
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            set_mode(&dir, 0o700);
            let config = dir.join("patroni.yml");
            std::fs::write(
                &config,
                member_config(host, &addrs, &dir, &pg_bin, &password),
            )
            .unwrap_or_else(|e| panic!("{}: {e}", config.display()));
            set_mode(&config, 0o600);
            for path in [&dir, &config] {
                std::os::unix::fs::chown(path, Some(uid), Some(gid))
                    .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
            }
            members.push(Member {
                host,
                log: host.dir().join("patroni.log"),
                dir,
                patroni: None,
            });
        }
        let mut cluster = PatroniCluster {
            members,
            password,
            pg_bin,
        };
        for member in &mut cluster.members {
            member.launch();
        }
        cluster.wait_ready(START_LIMIT);
        cluster
    }

    /// The libpq multi-host URL of database `db`: every member, and the first that takes
    /// writes wins.
    pub fn url(&self, db: &str) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}:{PG_PORT}", m.host.addr()))
            .collect();
        format!(
            "postgresql://{USER}:{}@{}/{db}?target_session_attrs=read-write&connect_timeout=3",
            self.password,
            hosts.join(",")
        )
    }

    /// The URL of database `db` on member `host` alone (a replica answers reads).
    pub fn member_url(&self, host: &str, db: &str) -> String {
        let member = self.member(host);
        format!(
            "postgresql://{USER}:{}@{}:{PG_PORT}/{db}?connect_timeout=3",
            self.password,
            member.host.addr()
        )
    }

    /// Runs `sql` with Debian's psql on host `on` against `url` (one statement commits on
    /// its own): its unaligned output, or psql's error (a connection refused or an SQL
    /// error alike).
    pub fn psql(&self, on: &Host, url: &str, sql: &str) -> Result<String, String> {
        run_psql(&on.launcher(), &self.psql_path(), url, sql)
    }

    /// Debian's psql, for [`run_psql`] from a thread that holds no borrow of the cluster.
    pub fn psql_path(&self) -> PathBuf {
        self.pg_bin.join("psql")
    }

    /// The member whose Patroni says it is the primary now, if exactly one does.
    pub fn primary(&self) -> Option<String> {
        self.only("/primary")
    }

    /// The member whose Patroni says it is the synchronous standby now, if exactly one
    /// does: the one a failover promotes.
    pub fn sync_standby(&self) -> Option<String> {
        self.only("/sync")
    }

    /// Kills the primary as a crash would (SIGKILL to Patroni and to all of its
    /// PostgreSQL's processes; the host stays up) and returns its name.
    pub fn kill_primary(&mut self) -> String {
        let primary = self
            .primary()
            .unwrap_or_else(|| panic!("no single primary to kill\n{}", self.logs()));
        self.kill(&primary);
        primary
    }

    /// SIGKILLs every process on member `host` (Patroni, PostgreSQL and anything else run
    /// there) and waits until they are gone.
    pub fn kill(&mut self, host: &str) {
        let member = self.member_mut(host);
        if let Err(e) = member.kill_all() {
            panic!("{e}\n{}", member.log_tail());
        }
    }

    /// Waits until a member other than `old` is the primary, and returns it.
    pub fn wait_for_primary_other_than(&self, old: &str, within: Duration) -> String {
        match poll(within, || self.primary().filter(|p| p != old)) {
            Some(new) => new,
            None => panic!(
                "no primary other than {old} after {within:?}\n{}",
                self.logs()
            ),
        }
    }

    /// Starts member `host`'s Patroni again on its data (after [`PatroniCluster::kill`]).
    pub fn restart(&mut self, host: &str) {
        let member = self.member_mut(host);
        assert!(member.patroni.is_none(), "{host}: Patroni is still running");
        member.launch();
    }

    /// Waits until member `host` is a running replica that is not lagging behind.
    pub fn wait_for_replica(&self, host: &str, within: Duration) {
        let member = self.member(host);
        if poll(within, || {
            (member.rest_status("/replica") == Some(200)).then_some(())
        })
        .is_none()
        {
            panic!(
                "{host}: not a running replica after {within:?}\n{}",
                member.log_tail()
            );
        }
    }

    /// The names of the members, in start order.
    pub fn members(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| m.host.name().to_string())
            .collect()
    }

    /// Waits for one primary, one synchronous standby and every other member a replica.
    fn wait_ready(&self, within: Duration) {
        let ready = poll(within, || {
            let primaries = self.count("/primary");
            let sync = self.count("/sync");
            let replicas = self.count("/replica");
            (primaries == 1 && sync == 1 && replicas == self.members.len() - 1).then_some(())
        });
        if ready.is_none() {
            panic!(
                "the Patroni cluster did not get a primary, a synchronous standby and \
                 replicas in {within:?}\n{}",
                self.logs()
            );
        }
    }

    /// The one member whose REST API answers 200 to `path`, if exactly one does.
    fn only(&self, path: &str) -> Option<String> {
        let found: Vec<&str> = self
            .members
            .iter()
            .filter(|m| m.rest_status(path) == Some(200))
            .map(|m| m.host.name())
            .collect();
        match found[..] {
            [one] => Some(one.to_string()),
            _ => None,
        }
    }

    fn count(&self, path: &str) -> usize {
        self.members
            .iter()
            .filter(|m| m.rest_status(path) == Some(200))
            .count()
    }

    fn member(&self, host: &str) -> &Member<'n> {
        self.members
            .iter()
            .find(|m| m.host.name() == host)
            .unwrap_or_else(|| panic!("no Patroni member on {host}"))
    }

    fn member_mut(&mut self, host: &str) -> &mut Member<'n> {
        self.members
            .iter_mut()
            .find(|m| m.host.name() == host)
            .unwrap_or_else(|| panic!("no Patroni member on {host}"))
    }

    /// Every member's log tail, for a failure that is the cluster's.
    fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| m.log_tail())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for PatroniCluster<'_> {
    fn drop(&mut self) {
        // No panic here (a test's panic may be unwinding): the Network's drop kills what
        // is left anyway.
        for member in &mut self.members {
            let _ = member.kill_all();
        }
    }
}

impl Member<'_> {
    /// Starts `patroni` on the host as the postgres user, its output appended to the log.
    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("{}: {e}", self.log.display()));
        let launcher = self.host.launcher();
        // setpriv execs patroni as postgres (nsenter must stay root to enter the host), so
        // the child is patroni itself. No PDEATHSIG: the thread that spawns into the host's
        // PID namespace ends at once; a test process killed leaves it to netns::sweep_stale.
        let mut command = launcher.daemon("setpriv");
        command
            .args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--reset-env",
                "--",
                PATRONI,
            ])
            .arg(self.dir.join("patroni.yml"))
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log's fd"))
            .stderr(log);
        let child = launcher
            .spawn(&mut command)
            .unwrap_or_else(|e| panic!("{}: start patroni: {e}", self.host.name()));
        self.patroni = Some(child);
    }

    /// SIGKILL to every process of the host (Patroni, PostgreSQL, their children), then
    /// waits until none is left, or says which are.
    fn kill_all(&mut self) -> Result<(), String> {
        let spared = [
            self.host.holder_pid(),
            self.host.init_pid(),
            std::process::id(),
        ];
        let deadline = Instant::now() + KILL_LIMIT;
        loop {
            let left: Vec<u32> = self
                .host
                .pids()
                .into_iter()
                .filter(|p| !spared.contains(p))
                .collect();
            if left.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{}: processes {left:?} still there {KILL_LIMIT:?} after SIGKILL",
                    self.host.name()
                ));
            }
            for pid in left {
                // SAFETY: kill(2) has no memory preconditions; these pids are this host's.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
            // Patroni is our child: reap it, or it stays listed as a zombie.
            if let Some(child) = self.patroni.as_mut() {
                let _ = child.try_wait();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(mut child) = self.patroni.take() {
            let _ = child.wait();
        }
        Ok(())
    }

    /// The HTTP status of `HEAD path` on this member's REST API, asked from its own host;
    /// None when it does not answer.
    fn rest_status(&self, path: &str) -> Option<u16> {
        let addr = SocketAddr::from((self.host.addr(), REST_PORT));
        let mut stream = self
            .host
            .launcher()
            .connect_within(addr, PROBE_LIMIT)
            .ok()?;
        stream.set_read_timeout(Some(PROBE_LIMIT)).ok()?;
        stream.set_write_timeout(Some(PROBE_LIMIT)).ok()?;
        // HEAD: Patroni answers with the status line alone. Read to its end: a connection
        // closed under Patroni's reply fills its log with tracebacks.
        write!(stream, "HEAD {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
        let mut reply = Vec::new();
        stream.take(4096).read_to_end(&mut reply).ok()?;
        // "HTTP/1.0 200 OK": the code is the status line's second word.
        std::str::from_utf8(&reply)
            .ok()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(LOG_TAIL)..];
        format!(
            "--- {}: the last {} lines of {} ---\n{}",
            self.host.name(),
            tail.len(),
            self.log.display(),
            tail.join("\n")
        )
    }
}

/// [`PatroniCluster::psql`] from the host's launcher and psql's path (both `Send`, for a
/// writer thread).
pub fn run_psql(
    launcher: &crate::netns::Launcher,
    psql: &Path,
    url: &str,
    sql: &str,
) -> Result<String, String> {
    let out = launcher
        .command(psql)
        .args([
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            url,
            "-c",
            sql,
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run psql: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Debian's `patroni` (it runs on Debian's python3, where python3-pysyncobj is).
const PATRONI: &str = "/usr/bin/patroni";

/// PostgreSQL's bin dir, after checking that every package the cluster needs is here.
fn require_packages() -> PathBuf {
    let bootstrap = "scripts/bootstrap.sh installs it";
    assert!(
        Path::new(PATRONI).is_file(),
        "no {PATRONI}: Debian's patroni is not installed ({bootstrap})"
    );
    let pysyncobj = std::process::Command::new("/usr/bin/python3")
        .args(["-c", "import pysyncobj"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        pysyncobj,
        "Patroni's Raft needs Debian's python3-pysyncobj, not installed ({bootstrap})"
    );
    let setpriv = std::process::Command::new("sh")
        .args(["-c", "command -v setpriv"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        setpriv,
        "no setpriv on PATH (Debian's util-linux; {bootstrap})"
    );
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            ["postgres", "initdb", "pg_basebackup", "pg_rewind", "psql"]
                .iter()
                .all(|b| bin.join(b).is_file())
                .then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "no /usr/lib/postgresql/*/bin with postgres, initdb, pg_basebackup, pg_rewind and \
             psql: Debian's postgresql is not installed ({bootstrap})"
        )
    })
}

/// Debian's `postgres` user's (uid, gid): PostgreSQL refuses to run as root.
fn postgres_owner() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("/etc/passwd");
    passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.first() == Some(&"postgres"))
        .and_then(|f| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))
        .expect(
            "no postgres user: Debian's postgresql is not installed \
             (scripts/bootstrap.sh installs it)",
        )
}

/// One member's patroni.yml. Short timings (a leader key lives 10 s, each member looks every
/// second) so that a test's failover takes seconds, not the default's half a minute.
fn member_config(
    host: &Host,
    addrs: &[Ipv4Addr],
    dir: &Path,
    pg_bin: &Path,
    password: &str,
) -> String {
    let me = host.addr();
    let [a, b, c, _] = me.octets();
    let subnet = format!("{a}.{b}.{c}.0/24");
    let partners: Vec<String> = addrs
        .iter()
        .filter(|&&addr| addr != me)
        .map(|addr| format!("'{addr}:{RAFT_PORT}'"))
        .collect();
    let dir = dir.display();
    let pg_bin = pg_bin.display();
    let name = host.name();
    format!(
        "\
scope: gpufleet
name: {name}
log:
  level: INFO
restapi:
  listen: '{me}:{REST_PORT}'
  connect_address: '{me}:{REST_PORT}'
raft:
  data_dir: '{dir}/raft'
  self_addr: '{me}:{RAFT_PORT}'
  partner_addrs: [{partners}]
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 3
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    postgresql:
      use_pg_rewind: true
      remove_data_directory_on_rewind_failure: true
      parameters:
        wal_log_hints: 'on'
  initdb:
    - encoding: UTF8
    - no-locale
    # Passwords from the start (initdb gets the superuser's from Patroni), never trust.
    - auth-local: scram-sha-256
    - auth-host: scram-sha-256
postgresql:
  listen: '{me}:{PG_PORT}'
  connect_address: '{me}:{PG_PORT}'
  data_dir: '{dir}/data'
  bin_dir: '{pg_bin}'
  pgpass: '{dir}/pgpass'
  authentication:
    superuser:
      username: {USER}
      password: '{password}'
    replication:
      username: {REPLICATION_USER}
      password: '{password}'
    rewind:
      username: {USER}
      password: '{password}'
  parameters:
    # Its own socket dir: the host's /run is its own, without /run/postgresql.
    unix_socket_directories: '{dir}'
    # A killed process, not a crashed machine: the page cache survives, and the tests
    # are faster without syncs.
    fsync: 'off'
    shared_buffers: 32MB
  pg_hba:
    - host all all 127.0.0.1/32 scram-sha-256
    - host all all {subnet} scram-sha-256
    - host replication {REPLICATION_USER} {subnet} scram-sha-256
watchdog:
  mode: 'off'
",
        partners = partners.join(", "),
    )
}

/// Polls `probe` every [`POLL`] until it gives a value or `within` has passed.
fn poll<T>(within: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", path.display()));
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .expect("/dev/urandom");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}
