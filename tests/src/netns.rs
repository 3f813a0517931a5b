//! A small network of hosts on this one machine, for the multi-host tier (issue 20).
//!
//! Each [`Host`] is its own network namespace with one address on a shared bridge, plus
//! its own mount, UTS and PID namespaces, as a machine apart has: its own hostname, its
//! own process table and `/proc` (a host's processes see no other host's), its own `/run`,
//! `/tmp`, `/var/tmp` and `/dev/shm` (tmpfs), its own `/etc` (an overlay on the machine's:
//! its own user database), its own mounts, and the machine's cgroup v1 hierarchies
//! mounted again (Slurm's task/cgroup needs them; `ip netns exec` gives the host a fresh
//! `/sys`). The harness's own files stay reachable: the network's directory (every host's
//! [`Host::dir`], where the harness puts data dirs, keys and Terraform's working
//! directory) is bound back at its path over the host's `/tmp`, and so is every mount
//! under the machine's `/tmp` when the network is made (the platform's shared storage in
//! the tests, standing for a file system every host mounts). A long-lived holder
//! (a perl that sleeps and reaps, the PID namespace's init) keeps those namespaces; every process of
//! the host runs through `nsenter` into them ([`Host::command`]; a long-lived process
//! with [`Launcher::daemon`] and [`Launcher::spawn`], so that its pid is the harness's
//! child and signals reach it). The
//! bridge lives in a "switch" namespace of its own, so the root namespace gets no link,
//! address or route: traffic between hosts never touches the machine's own network.
//!
//! Names: `gfmh-<pid>-<n>-<host>` (`-sw` for the switch), so a later run can tell the
//! namespaces of a test process that died (its pid is gone) and sweep them
//! ([`sweep_stale`]). [`Network`]'s `Drop` (which runs on a panic too) kills every process
//! in its namespaces and deletes them. Needs root (`ip netns`), as CI runs.
//!
//! A host can be cut off (its switch port down: a partition, the host stays up) and
//! healed, and its link shaped slower with `tc` (both directions).

use std::fs;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What every namespace of this harness is called first.
pub const PREFIX: &str = "gfmh-";

/// A holder is up in well under a second; past this something is wrong.
const HOLDER_LIMIT: Duration = Duration::from_secs(20);
/// Killed processes leave their namespace at once; past this teardown gives up on waiting.
const TEARDOWN_LIMIT: Duration = Duration::from_secs(20);

static NETWORKS: AtomicU32 = AtomicU32::new(0);

/// Fails the test `what` (e.g. "the multi-host Slurm tests") naming what this machine
/// lacks for the tier: a test never skips itself (CI runs as root with namespaces).
pub fn require(what: &str) {
    if let Some(why) = unavailable() {
        panic!("{what} need {why}");
    }
}

/// Whether this machine can run the tier: root with `ip`, `tc`, `unshare` and `nsenter`
/// (None), or what it lacks. Tests call [`require`]; benchmarks say they did not run.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("the multi-host tier needs root (network namespaces)".into());
    }
    for tool in ["ip", "tc", "unshare", "nsenter"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Some(format!("the multi-host tier needs `{tool}` on PATH"));
        }
    }
    None
}

/// Runs `program args` and fails naming the command and its stderr.
fn must(program: &str, args: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {program} {}: {e}", args.join(" ")));
    assert!(
        out.status.success(),
        "{program} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Every namespace `ip netns` knows of.
pub fn namespaces() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output();
    let Ok(out) = out else { return Vec::new() };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The pids of every process in namespace `ns`.
pub fn pids_in(ns: &str) -> Vec<u32> {
    let out = Command::new("ip").args(["netns", "pids", ns]).output();
    let Ok(out) = out else { return Vec::new() };
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Kills every process in `ns`, waits for them to be gone, deletes the namespace.
fn remove_namespace(ns: &str) {
    let deadline = Instant::now() + TEARDOWN_LIMIT;
    loop {
        let pids = pids_in(ns);
        if pids.is_empty() || Instant::now() >= deadline {
            break;
        }
        for pid in pids {
            // SAFETY: kill has no memory preconditions; these pids are in our namespace.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = Command::new("ip")
        .args(["netns", "del", ns])
        .stderr(Stdio::null())
        .status();
}

/// Deletes the namespaces (and kills their processes) of harness runs whose test process
/// is gone: a run killed before its teardown. Namespaces of live processes stay.
pub fn sweep_stale() {
    for ns in namespaces() {
        let Some(rest) = ns.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            remove_namespace(&ns);
        }
    }
}

/// A host's way into its namespaces, for whoever starts its processes: cheap to clone,
/// valid while its [`Network`] lives.
#[derive(Clone, Debug)]
pub struct Launcher {
    /// The host's init (pid 1 of its PID namespace), as this machine numbers it.
    holder: u32,
    ns: String,
}

impl Launcher {
    /// `program` to run on this host: its network, its mounts (its `/run`, `/tmp`), its
    /// hostname and its PID namespace. `nsenter` forks into the PID namespace and waits
    /// for the program, passing on its exit status: for commands that run to their end
    /// (a signal to the returned child reaches `nsenter`, not the program; see
    /// [`Launcher::daemon`]).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg("-t")
            .arg(self.holder.to_string())
            .args(["-n", "-m", "-u", "-p", "--"])
            .arg(program);
        command
    }

    /// `program` to run on this host as a long-lived process that the harness signals
    /// (an agent, a control plane): spawned with [`Launcher::spawn`], it is the harness's
    /// own child (nsenter execs it without a fork), in the host's PID namespace.
    pub fn daemon(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg("-t")
            .arg(self.holder.to_string())
            .args(["-n", "-m", "-u", "--"])
            .arg(program);
        command
    }

    /// Spawns `command` (from [`Launcher::daemon`]) into this host's PID namespace: from a
    /// thread of its own whose children are born there (setns of the PID namespace holds
    /// for the caller's children only), which ends after.
    pub fn spawn(&self, command: &mut Command) -> std::io::Result<Child> {
        let path = PathBuf::from(format!("/proc/{}/ns/pid", self.holder));
        std::thread::scope(|s| {
            s.spawn(|| {
                let ns = fs::File::open(&path)?;
                // SAFETY: setns on this thread only, with an fd this closure owns.
                if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWPID) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                command.spawn()
            })
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the spawning thread panicked")))
        })
    }

    /// Like [`Launcher::command`], run in directory `dir` (entering a mount namespace
    /// leaves the caller's working directory behind; set it there instead).
    pub fn command_in(&self, dir: &Path, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg("-t")
            .arg(self.holder.to_string())
            .args(["-n", "-m", "-u", "-p"])
            .arg(format!("--wd={}", dir.display()))
            .arg("--")
            .arg(program)
            // Go programs (Terraform) trust $PWD when it names the working directory.
            .env("PWD", dir);
        command
    }

    /// Runs `f` in this host's network namespace, on a thread of its own that ends after
    /// (a thread that entered a namespace is never reused for anything else). Sockets `f`
    /// makes stay in the namespace whichever thread uses them later.
    pub fn within<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<T> {
        let path = PathBuf::from("/run/netns").join(&self.ns);
        std::thread::spawn(move || {
            let ns = fs::File::open(&path)?;
            // SAFETY: setns on this thread only, with an fd this closure owns.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the namespace's thread panicked")))
    }

    /// A TCP connection to `addr` made from this host (giving up after `limit`).
    pub fn connect_within(
        &self,
        addr: SocketAddr,
        limit: Duration,
    ) -> std::io::Result<std::net::TcpStream> {
        self.within(move || {
            let stream = std::net::TcpStream::connect_timeout(&addr, limit)?;
            stream.set_nodelay(true)?;
            Ok(stream)
        })
    }

    /// [`Launcher::connect_within`] 5 seconds.
    pub fn connect(&self, addr: SocketAddr) -> std::io::Result<std::net::TcpStream> {
        self.connect_within(addr, Duration::from_secs(5))
    }

    /// A TCP listener on `addr` (port 0: a free one) in this host's namespace.
    pub fn listen(&self, addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
        self.within(move || std::net::TcpListener::bind(addr))
    }
}

pub struct Host {
    name: String,
    ns: String,
    /// The namespace holding the bridge, where this host's switch port is.
    switch: String,
    /// This host's switch port (the bridge's end of its veth pair).
    port: String,
    addr: Ipv4Addr,
    /// `unshare`, which made the namespaces and waits for their init.
    holder: Child,
    /// The init of the host's PID namespace (a perl that sleeps and reaps), as this machine
    /// numbers it.
    init: u32,
    dir: PathBuf,
}

impl Host {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The network namespace's name (`ip netns`).
    pub fn namespace(&self) -> &str {
        &self.ns
    }

    /// Its one address on the bridge.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// This host's own directory (its data dirs go here); removed with the network.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn launcher(&self) -> Launcher {
        Launcher {
            holder: self.init,
            ns: self.ns.clone(),
        }
    }

    /// The pid (this machine's number) of the host's init, pid 1 of its PID namespace.
    pub fn init_pid(&self) -> u32 {
        self.init
    }

    /// See [`Launcher::command`].
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        self.launcher().command(program)
    }

    /// Starts `program args` on this host, output discarded.
    pub fn spawn(&self, program: &str, args: &[&str]) -> Child {
        self.command(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: spawn {program}: {e}", self.name))
    }

    /// Runs `program args` on this host and returns its output (whatever its exit).
    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        self.command(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{}: run {program}: {e}", self.name))
    }

    /// The pid of the process that holds the host's namespaces.
    pub fn holder_pid(&self) -> u32 {
        self.holder.id()
    }

    /// Every process on this host (`ip netns pids`), the holder included.
    pub fn pids(&self) -> Vec<u32> {
        pids_in(&self.ns)
    }

    /// The command names of this host's processes but the holder's and its init's.
    pub fn processes(&self) -> Vec<(u32, String)> {
        self.pids()
            .into_iter()
            .filter(|&p| p != self.holder.id() && p != self.init)
            .filter_map(|p| {
                let comm = fs::read_to_string(format!("/proc/{p}/comm")).ok()?;
                Some((p, comm.trim().to_string()))
            })
            .collect()
    }

    /// Gives this host its own copy of each of `dirs`: an overlay on the machine's, its
    /// changes in a tmpfs under the host's dir, so what the host writes there stays on it
    /// (and goes with it) and the machine's stay as they were.
    pub fn private_copies(&self, dirs: &[&Path]) {
        static LAYERS: AtomicU32 = AtomicU32::new(0);
        let layer = self.dir.join(format!(
            "private-{}",
            LAYERS.fetch_add(1, Ordering::Relaxed)
        ));
        let quoted = |p: &Path| format!("'{}'", p.display().to_string().replace('\'', "'\\''"));
        let l = quoted(&layer);
        let mut script = format!("mkdir -p {l} && mount -t tmpfs -o mode=700 tmpfs {l}");
        for (i, dir) in dirs.iter().enumerate() {
            let (upper, work) = (
                quoted(&layer.join(format!("u{i}"))),
                quoted(&layer.join(format!("w{i}"))),
            );
            script.push_str(&format!(
                " && mkdir {upper} {work} && mount -t overlay overlay -o lowerdir={d},upperdir={upper},workdir={work} {d}",
                d = quoted(dir)
            ));
        }
        let out = self.run("sh", &["-c", &script]);
        assert!(
            out.status.success(),
            "{}: private copies of {dirs:?}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A partition: the host's switch port goes down; the host and its processes stay up
    /// and packets to and from it are lost until [`Host::heal`].
    pub fn cut(&self) {
        must(
            "ip",
            &["-n", &self.switch, "link", "set", &self.port, "down"],
        );
    }

    pub fn heal(&self) {
        must("ip", &["-n", &self.switch, "link", "set", &self.port, "up"]);
    }

    /// Shapes the host's link to `rate` (tc syntax, e.g. `50mbit`) both ways: what the
    /// switch sends it and what it sends.
    pub fn shape(&self, rate: &str) {
        for (ns, dev) in self.link_ends() {
            must(
                "tc",
                &[
                    "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst",
                    "32kbit", "latency", "400ms",
                ],
            );
        }
    }

    /// Both ends of the host's link, as (namespace, device).
    fn link_ends(&self) -> [(&str, &str); 2] {
        [(&self.switch, &self.port), (&self.ns, "eth0")]
    }

    /// Removes [`Host::shape`]'s shaping.
    pub fn unshape(&self) {
        for (ns, dev) in self.link_ends() {
            let _ = Command::new("tc")
                .args(["-n", ns, "qdisc", "del", "dev", dev, "root"])
                .stderr(Stdio::null())
                .status();
        }
    }
}

pub struct Network {
    /// `gfmh-<pid>-<n>`: every namespace of this network starts with it.
    tag: String,
    switch: String,
    hosts: Vec<Host>,
    /// Holds every host's directory.
    root: Option<tempfile::TempDir>,
}

impl Network {
    /// A bridge and one host per name (DNS labels, at most 11 characters: a switch port
    /// is named after its host), each with its own address, hostname and `/run`. Sweeps
    /// the namespaces of dead earlier runs first.
    pub fn new(names: &[&str]) -> Network {
        sweep_stale();
        let n = NETWORKS.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let tag = format!("{PREFIX}{pid}-{n}");
        // A subnet of 10.0.0.0/8 of this network's own; the addresses never leave its
        // namespaces, so this only keeps logs unambiguous.
        let subnet = [10u8, (pid % 200 + 20) as u8, (n % 250) as u8];
        assert!(names.len() < 250, "at most 249 hosts on one bridge");
        let root = tempfile::Builder::new()
            .prefix(&format!("{tag}-"))
            .tempdir()
            .expect("create the network's temp dir");
        let switch = format!("{tag}-sw");
        let mut net = Network {
            tag,
            switch: switch.clone(),
            hosts: Vec::new(),
            root: Some(root),
        };
        // From here on a failure tears down whatever was made (Drop).
        must("ip", &["netns", "add", &switch]);
        must(
            "ip",
            &["-n", &switch, "link", "add", "br0", "type", "bridge"],
        );
        must("ip", &["-n", &switch, "link", "set", "br0", "up"]);
        for (i, name) in names.iter().enumerate() {
            assert!(
                name.len() <= 11 && !name.is_empty(),
                "host name {name:?}: 1 to 11 characters"
            );
            let addr = Ipv4Addr::new(subnet[0], subnet[1], subnet[2], i as u8 + 1);
            let host = net.add_host(name, addr);
            net.hosts.push(host);
        }
        net
    }

    fn add_host(&self, name: &str, addr: Ipv4Addr) -> Host {
        let ns = format!("{}-{name}", self.tag);
        let sw = &self.switch;
        let port = format!("p-{name}");
        must("ip", &["netns", "add", &ns]);
        must(
            "ip",
            &[
                "-n", sw, "link", "add", "name", &port, "type", "veth", "peer", "name", "eth0",
                "netns", &ns,
            ],
        );
        must(
            "ip",
            &["-n", sw, "link", "set", &port, "master", "br0", "up"],
        );
        must(
            "ip",
            &[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ],
        );
        must("ip", &["-n", &ns, "link", "set", "eth0", "up"]);
        must("ip", &["-n", &ns, "link", "set", "lo", "up"]);
        let dir = self.root.as_ref().expect("root").path().join(name);
        fs::create_dir_all(&dir).expect("create the host's dir");
        let root = self.root.as_ref().expect("root").path().to_path_buf();
        let (holder, init) = start_holder(&ns, name, &dir, &root);
        Host {
            name: name.to_string(),
            ns,
            switch: sw.clone(),
            port,
            addr,
            holder,
            init,
            dir,
        }
    }

    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no host {name} in this network"))
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Every namespace of this network (the switch's too).
    pub fn namespaces(&self) -> Vec<String> {
        let mut all: Vec<String> = self.hosts.iter().map(|h| h.ns.clone()).collect();
        all.push(self.switch.clone());
        all
    }

    /// What every namespace of this network starts with.
    pub fn tag(&self) -> &str {
        &self.tag
    }
}

/// The checkout and the build's target dir when they lie under `/tmp` or `/var/tmp` (a
/// clone there, as CI may make): the hosts run its binaries and tools and read its guides,
/// so they stay at their paths over each host's own `/tmp`.
fn checkout_under_tmp() -> Vec<PathBuf> {
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from);
    let mut found: Vec<PathBuf> = std::iter::once(checkout)
        .chain(target)
        .filter_map(|p| fs::canonicalize(p).ok())
        .filter(|p| {
            [Path::new("/tmp"), Path::new("/var/tmp")]
                .iter()
                .any(|t| p.starts_with(t))
        })
        .collect();
    // A target dir inside the checkout comes with it.
    found.sort();
    found.dedup_by(|inner, outer| inner.starts_with(&*outer));
    found
}

/// The process that holds a host's mount, UTS and PID namespaces (inside its network
/// namespace): `unshare --pid --fork --mount-proc`, whose child, the PID namespace's init,
/// sets the hostname, drops this machine's team volume mounts (under `/run/gpufleet`:
/// another test's node agents', which the host's agent would take for its neighbours'),
/// mounts a tmpfs on `/run`, gives the host an `/etc` of its own (an
/// overlay on this machine's, its changes in a tmpfs under the host's `dir`: each host has
/// its own user database, as hosts apart do, so one host adding or removing a cluster's
/// account changes no other), mounts the machine's cgroup hierarchies again, private
/// tmpfs on `/tmp`, `/var/tmp` and `/dev/shm` with the network's directory `root` bound
/// back at its path, says `ready`, then sleeps as the host's init, reaping the orphans
/// it inherits as a real host's init does (SIGCHLD ignored, so the kernel reaps its
/// children at once; perl, Debian's essential perl-base, because a shell's `trap '' CHLD`
/// does not ignore it; an orphan left a zombie would hold its pid and its cgroup's `pids`
/// count for the host's life). Returns (unshare, init).
fn start_holder(ns: &str, name: &str, dir: &Path, root: &Path) -> (Child, u32) {
    let layer = dir.join("etc-layer");
    let layer = layer.display();
    // What stays at its path over the host's own /tmp and /var/tmp: the network's
    // directory, and the mounts there now (the platform's shared storage in the tests,
    // standing for a file system every host mounts).
    let mut kept = vec![root.to_path_buf()];
    kept.extend(mounts_under(&["/tmp", "/var/tmp"]));
    kept.extend(checkout_under_tmp());
    let keep = kept
        .iter()
        .enumerate()
        .map(|(i, p)| {
            format!(
                "mkdir /run/gfmh-keep/{i} && mount --rbind {} /run/gfmh-keep/{i}",
                p.display()
            )
        })
        .collect::<Vec<_>>()
        .join(" && ");
    let restore = kept
        .iter()
        .enumerate()
        .map(|(i, p)| {
            format!(
                "mkdir -p {p} && mount --move /run/gfmh-keep/{i} {p} && rmdir /run/gfmh-keep/{i}",
                p = p.display()
            )
        })
        .collect::<Vec<_>>()
        .join(" && ");
    let script = format!(
        "hostname {name} \
         && for m in $(awk '$5 ~ \"^/run/gpufleet/\" {{print $5}}' /proc/self/mountinfo | sort -r); do umount -l $m; done \
         && mount -t tmpfs -o mode=755 tmpfs /run \
         && mkdir -p {layer} && mount -t tmpfs -o mode=700 tmpfs {layer} \
         && mkdir {layer}/upper {layer}/work \
         && mount -t overlay overlay -o lowerdir=/etc,upperdir={layer}/upper,workdir={layer}/work /etc \
         && {cgroups} \
         && mkdir /run/gfmh-keep && {keep} \
         && mount -t tmpfs -o mode=1777 tmpfs /tmp && mount -t tmpfs -o mode=1777 tmpfs /var/tmp \
         && mount -t tmpfs -o mode=1777 tmpfs /dev/shm \
         && {restore} && rmdir /run/gfmh-keep \
         && echo ready && exec perl -e '$SIG{{CHLD}} = \"IGNORE\"; sleep while 1'",
        cgroups = cgroup_mounts(),
    );
    let mut child = Command::new("ip")
        .args([
            "netns", "exec", ns, "unshare", "--mount", "--uts", "--pid", "--fork",
        ])
        .args([
            "--mount-proc",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("{name}: start the namespace holder: {e}"));
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let ready = rx.recv_timeout(HOLDER_LIMIT);
    // `ip netns exec` execs unshare, whose one child is the namespace's init.
    let pid = child.id();
    let init = fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()
        .and_then(|c| c.split_whitespace().next().and_then(|p| p.parse().ok()));
    match (ready, init) {
        (Ok(line), Some(init)) if line.trim() == "ready" => (child, init),
        (other, init) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{name}: the namespace holder did not get ready: {other:?} (init {init:?})");
        }
    }
}

/// The mount points of this machine under `dirs` (outermost first), but those whose path
/// mountinfo escapes (a space or a backslash: not for a shell line).
fn mounts_under(dirs: &[&str]) -> Vec<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| !p.contains('\\'))
        .map(PathBuf::from)
        .filter(|p| dirs.iter().any(|d| p.starts_with(d) && p != Path::new(d)))
        .collect();
    found.sort();
    found.dedup();
    // A mount under another is carried with it (and would not be found once it moved).
    let all = found.clone();
    found.retain(|p| !all.iter().any(|o| o != p && p.starts_with(o)));
    found
}

/// Shell commands that mount this machine's cgroup hierarchies (v1 and v2, as
/// /proc/self/mounts lists them under /sys/fs/cgroup) again on a host's fresh `/sys`.
fn cgroup_mounts() -> String {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut commands = vec!["mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup".to_string()];
    for line in mounts.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [_, at, kind, options, ..] = fields[..] else {
            continue;
        };
        if !at.starts_with("/sys/fs/cgroup/") || !["cgroup", "cgroup2"].contains(&kind) {
            continue;
        }
        commands.push(format!(
            "mkdir -p {at} && mount -t {kind} -o {options} {kind} {at}"
        ));
    }
    commands.join(" && ")
}

impl Drop for Network {
    fn drop(&mut self) {
        for host in &mut self.hosts {
            remove_namespace(&host.ns);
            let _ = host.holder.kill();
            let _ = host.holder.wait();
        }
        remove_namespace(&self.switch);
        // A host whose setup failed half-way is not in `hosts` yet.
        let mine = format!("{}-", self.tag);
        for ns in namespaces().into_iter().filter(|ns| ns.starts_with(&mine)) {
            remove_namespace(&ns);
        }
        // The hosts' dirs go with the temp dir.
        drop(self.root.take());
    }
}
