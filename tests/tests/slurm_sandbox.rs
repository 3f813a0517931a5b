//! Two teams' Slurm clusters on one machine (the single-host tier: both nodes on this host,
//! each running its cluster's slurmd, controller and login), each team with only its own
//! key: from team B's login and from its jobs, nothing of team A is in sight.
//!
//! - `ps` shows no process of A (A has a job running and a process left on its login):
//!   `/proc` is a `hidepid=invisible` instance in the login's and slurmd's namespaces;
//! - A's files in its login's and its job's `/tmp`, `/var/tmp`, `/dev/shm` and `/run/lock`
//!   are not in B's, nor in the host's (each login has its own tmpfs, each job its own
//!   `/tmp` and `/dev/shm` from `job_container/tmpfs`, each node's jobs their `/var/tmp`
//!   and `/run/lock` from slurmd's namespace), nor A's System V shared memory in B's `ipcs`;
//! - each private temporary directory is a tmpfs of 1 GiB, in B's login and its jobs;
//! - B's jobs' `/tmp` on a node is a file system of the agent's `--job-tmp-mib` (64 here):
//!   a job writing past it fails with "No space left on device", the host's disk holds no
//!   more than the bound meanwhile (a sparse file in the agent's data dir; nothing in the
//!   host's view of the jobs' base), and gets it back when the job ends;
//! - B's home (no team volume is the home here) is a file system of the agent's
//!   `--home-mib` (64 here) on the host, the same for its login and its jobs: B writing
//!   past it from its login gets "No space left on device", the host's disk holds no more
//!   than the bound (a sparse file in the agent's data dir), and B's files in it outlive a
//!   `kill -9` and restart of the agent (one mount still, the same file system);
//! - B's cgroupfs shows B's own cgroups only: no name, uid or job of A in B's login's or
//!   job's `/sys/fs/cgroup` or `/proc/self/cgroup` (each login and node has a cgroup
//!   namespace of its own);
//! - no account of A in B's `/etc/passwd` or `/etc/group`, `id A` says no such user, and
//!   `/run/gpufleet` cannot be listed;
//! - a job that asks for one MIG slice has `CUDA_VISIBLE_DEVICES=0` and can open that
//!   slice's device alone: the node's other slices are refused by its device cgroup;
//! - a job gets the memory it asked for and no more (killed by the OOM killer past it), and
//!   its one CPU alone;
//! - destroying A's cluster leaves nothing of A on the host: no process (none left when the
//!   apply returns: the agent waits for them before it removes the account), no file of its
//!   uid in `/tmp`, `/var/tmp`, `/dev/shm`, `/run/lock` or the agents' data dirs, no mount
//!   naming it, no home file system or loop device of it, no cgroup of its node, no
//!   account, no runtime directory.
//!
//! Runs as root with namespaces and cgroup v1 (as CI does); what is missing fails the
//! test naming it.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gpufleet_e2e::slurm_login::{credentials, shell_word, sliced_team, team_key_in, Session};
use gpufleet_e2e::{eventually, Backend, NodeAgent, Terraform};

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(60);
const A: &str = "gpufleet_tenant_cluster.a";
const B: &str = "gpufleet_tenant_cluster.b";
/// The host-shared writable directories a login or job may write to.
const TEMP: &str = "/tmp /var/tmp /dev/shm /run/lock";

/// The real uid of a process, from /proc (this machine's view: every process).
fn uid_of(pid: &str) -> Option<u32> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Every process of this machine: (pid, uid, command line).
fn processes() -> Vec<(String, Option<u32>, String)> {
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|p| p.chars().all(|c| c.is_ascii_digit()))
        .map(|p| {
            let cmd = fs::read(format!("/proc/{p}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                .unwrap_or_default();
            let uid = uid_of(&p);
            (p, uid, cmd)
        })
        .collect()
}

/// Files (and directories) owned by `uid` under `root`, on any filesystem.
fn owned_by(root: &Path, uid: u32) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let Ok(meta) = fs::symlink_metadata(e.path()) else {
                continue;
            };
            if meta.uid() == uid {
                found.push(e.path());
            }
            if meta.is_dir() {
                stack.push(e.path());
            }
        }
    }
    found
}

/// What of cluster `name` (account `uid`, node `node`) this machine still holds.
fn leftovers(name: &str, uid: u32, node: &str, dirs: &[PathBuf]) -> Vec<String> {
    let mut left: Vec<String> = processes()
        .into_iter()
        .filter(|(_, u, cmd)| *u == Some(uid) || cmd.contains(name))
        .map(|(p, u, cmd)| format!("process {p} (uid {u:?}): {cmd}"))
        .collect();
    let mut roots: Vec<PathBuf> = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/run/gpufleet"]
        .iter()
        .map(PathBuf::from)
        .collect();
    roots.extend(dirs.iter().cloned());
    for root in &roots {
        left.extend(
            owned_by(root, uid)
                .into_iter()
                .map(|p| format!("file of uid {uid}: {}", p.display())),
        );
    }
    // Mounts of any process's namespace that name the cluster (a job's private /tmp is
    // under its node's data dir, named by the cluster).
    for (p, _, _) in processes() {
        let mounts = fs::read_to_string(format!("/proc/{p}/mountinfo")).unwrap_or_default();
        left.extend(
            mounts
                .lines()
                .filter(|l| l.contains(name))
                .map(|l| format!("mount in process {p}'s namespace: {l}")),
        );
    }
    let login = format!("gpufleet_login_{name}_");
    let slurmd = format!("gpufleet_slurmd_{name}_");
    for controller in fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        for e in fs::read_dir(controller.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let n = e.file_name().to_string_lossy().to_string();
            if n == format!("slurm_{node}") || n.starts_with(&login) || n.starts_with(&slurmd) {
                left.push(format!("cgroup {}", e.path().display()));
            }
        }
    }
    for dir in [Path::new("/run/gpufleet"), Path::new("/run/gpufleet/homes")] {
        if dir.join(name).exists() {
            left.push(format!("{}", dir.join(name).display()));
        }
    }
    // The cluster's file systems' files (its home's, its jobs' /tmp) and the loop
    // devices that held them (which name a deleted file "... (deleted)").
    for image in ["home.img", "jobs.img"] {
        for dir in dirs {
            let at = dir.join("slurm").join(name).join(image);
            if at.exists() {
                left.push(format!("file system {}", at.display()));
            }
        }
    }
    for device in fs::read_dir("/sys/block").unwrap().flatten() {
        let backing = fs::read_to_string(device.path().join("loop/backing_file"));
        if let Ok(file) = backing.as_deref().map(str::trim) {
            if file.contains(&format!("/{name}/")) {
                left.push(format!(
                    "loop device {}: {file}",
                    device.file_name().to_string_lossy()
                ));
            }
        }
    }
    let account = Command::new("getent")
        .args(["passwd", &uid.to_string()])
        .output()
        .unwrap();
    if account.status.success() {
        left.push(format!(
            "account {}",
            String::from_utf8_lossy(&account.stdout).trim()
        ));
    }
    left
}

/// Waits (at most LIMIT) until `probe` finds nothing; fails naming what it still finds.
fn nothing_left(team: &str, probe: impl Fn() -> Vec<String>) {
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        let left = probe();
        if left.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "left of team {team} after its cluster was destroyed: {left:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Fails naming what this machine lacks for the sandbox (rather than skipping).
fn require_the_platform() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the sandbox needs root (mount namespaces, device files, cgroups), as CI runs"
    );
    for controller in ["memory", "cpuset", "devices", "freezer"] {
        let at = Path::new("/sys/fs/cgroup").join(controller);
        assert!(
            at.join("cgroup.procs").exists(),
            "cgroup v1 controller {controller} is not mounted at {} (Slurm's task/cgroup needs it)",
            at.display()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_team_sees_nothing_of_another_on_a_shared_host_and_destroy_leaves_nothing() {
    require_the_platform();
    let backend = Backend::start_external("30s", "5m");
    // Each node declares the host's own CPUs (no --cpus): jobs are pinned to cores.
    let mut agents: Vec<NodeAgent> = ["sba", "sbb"]
        .iter()
        .map(|n| {
            let flags = ["--gpus", "1", "--job-tmp-mib", "64", "--home-mib", "64"];
            NodeAgent::start(&backend, n, &flags)
        })
        .collect();
    let _logs = SlurmLogs(
        agents
            .iter()
            .map(|a| a.data_dir())
            .chain([backend.data_dir()])
            .collect(),
    );
    let admin = backend.admin().await;
    eventually("2 nodes ready", LIMIT, || {
        let mut admin = admin.clone();
        async move {
            let nodes = admin.nodes().await;
            (nodes.len() == 2 && nodes.iter().all(|n| n.state == "ready")).then_some(())
        }
    })
    .await;
    let keys = tempfile::tempdir().unwrap();
    let ((a_key, a_pub), (b_key, b_pub)) =
        (team_key_in(keys.path(), "a"), team_key_in(keys.path(), "b"));
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.keep_credentials_in_state(); // reads the deprecated attributes
    tf.write_file("a.pub", &a_pub);
    tf.write_file("b.pub", &b_pub);
    tf.write_main(&format!("{}{}", sliced_team("a"), sliced_team("b")));
    tf.init();
    tf.apply();
    let (a_creds, b_creds) = (credentials(&tf, A), credentials(&tf, B));
    let (a, b) = (
        Session::here(keys.path(), &a_creds, &a_key),
        Session::here(keys.path(), &b_creds, &b_key),
    );
    let a_name = a_creds["user"].as_str().unwrap().to_string();
    let b_name = b_creds["user"].as_str().unwrap().to_string();
    let a_uid: u32 = a.ok("id -u").trim().parse().unwrap();
    let b_uid: u32 = b.ok("id -u").trim().parse().unwrap();
    let a_node = tf.resource(A)["nodes"][0]["hostname"]
        .as_str()
        .unwrap()
        .to_string();
    let b_node = tf.resource(B)["nodes"][0]["hostname"]
        .as_str()
        .unwrap()
        .to_string();
    let marker = format!("secret-of-a-{}", std::process::id());
    // Each team's volume is mounted on this machine (node-local, external agents).
    let volume_of = |address: &str| {
        tf.resource(address)["storage_path"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (a_volume, b_volume) = (volume_of(A), volume_of(B));
    let a_tenant = tf.resource("gpufleet_tenant.a")["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        a_volume.contains(&a_tenant)
            && fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .contains(&a_volume),
        "A's volume {a_volume} is mounted on this machine"
    );

    // A leaves files in its login's temporary directories, a System V shared memory
    // segment and a process on its login, and runs a job that writes to its own
    // temporary directories and waits.
    a.ok(&format!(
        "for d in {TEMP}; do echo {marker} > $d/{marker} || exit 1; done; ipcmk -M 4096"
    ));
    a.ok("setsid sh -c 'exec sleep 3001' </dev/null >/dev/null 2>&1 &");
    let job = a
        .ok(&format!(
            "sbatch --parsable -N1 --output=/dev/null --wrap {}",
            shell_word(&format!(
                "for d in {TEMP}; do echo {marker} > $d/{marker}-job; done; exec sleep 3002"
            ))
        ))
        .trim()
        .to_string();
    eventually("A's job running with its files written", LIMIT, || {
        let running = a
            .run(&format!("squeue -h -j {job} -o %T"))
            .1
            .trim()
            .to_string();
        let procs = processes();
        let both = ["sleep 3001", "sleep 3002"].iter().all(|s| {
            procs
                .iter()
                .any(|(_, u, c)| *u == Some(a_uid) && c.contains(s))
        });
        async move { (running == "RUNNING" && both).then_some(()) }
    })
    .await;
    // A's files are private to A: not in this machine's temporary directories; its
    // segment not in this machine's IPC.
    for shared in TEMP.split(' ') {
        for file in [marker.clone(), format!("{marker}-job")] {
            let at = Path::new(shared).join(file);
            assert!(!at.exists(), "A's file is in the host's {shared}: {at:?}");
        }
    }
    let host_ipc =
        String::from_utf8_lossy(&Command::new("ipcs").arg("-m").output().unwrap().stdout)
            .to_string();
    assert!(
        !host_ipc.contains(&a_name) && !host_ipc.contains(&a_uid.to_string()),
        "A's shared memory segment is in the host's IPC: {host_ipc}"
    );
    let own_ipc = a.ok("ipcs -m");
    assert!(own_ipc.contains("4096"), "A's own ipcs: {own_ipc}");
    // A sees its own processes and files (what B must not see is there to be seen).
    let own = a.ok("ps -eo user:32,args");
    assert!(own.contains("sleep 3001"), "A's own ps: {own}");

    // B's login and B's jobs see none of it.
    for (place, (ok, out)) in [
        ("login", b.run("ps -eo uid,user:32,args")),
        ("job", b.job("", "ps -eo uid,user:32,args")),
    ] {
        assert!(ok, "ps on B's {place}: {out}");
        assert!(
            out.contains("ps -eo"),
            "B's {place} does not see its own ps: {out}"
        );
        for never in [
            a_name.as_str(),
            &a_uid.to_string(),
            "sleep 300",
            "slurmd",
            "sshd",
            "gpufleet-agent",
        ] {
            assert!(
                !out.contains(never),
                "B's {place} sees a process it should not ({never}): {out}"
            );
        }
    }
    let probe = format!(
        "ls -a {TEMP}; for d in {TEMP}; do cat $d/{marker}* 2>&1; done; ipcs -m; \
         cat /proc/self/cgroup; find /sys/fs/cgroup -type d; \
         grep -c {a_name} /etc/passwd /etc/group; getent passwd {a_name} {a_uid} || echo no-such-user; \
         grep ^gf /etc/passwd | cut -d: -f1; ls /run/gpufleet 2>&1 || true; cat /proc/self/mountinfo; \
         touch {b_volume}/own-$$ && echo own-volume-writable"
    );
    for (place, out) in [("login", b.ok(&probe)), ("job", b.job_ok("", &probe))] {
        for never in [
            format!("uid_{a_uid}"),
            a_uid.to_string(),
            format!("slurm_{a_node}"),
            "gpufleet_login_".to_string(),
            "gpufleet_slurmd_".to_string(),
        ] {
            assert!(
                !out.contains(&never),
                "B's {place} sees A's or the host's cgroups ({never}): {out}"
            );
        }
        // Of the team volume mounts, its own tenant's alone: A's tenant id and volume are
        // in no mount it lists (they are in the host's), its own volume is there to use.
        assert!(
            !out.contains(&a_tenant) && !out.contains(&a_volume),
            "B's {place} lists A's volume mount ({a_volume}): {out}"
        );
        assert!(
            out.contains(&format!(" {b_volume} ")) && out.contains("own-volume-writable"),
            "B's {place} lacks its own volume {b_volume}: {out}"
        );
        // Of the homes' mounts, its own alone (A's name is in none it lists, see below).
        let b_home = format!(" /run/gpufleet/homes/{b_name}/home ");
        assert!(
            out.contains(&b_home),
            "B's {place} lacks its home mount: {out}"
        );
        // Its own cgroups, from the root of its view.
        let own = match place {
            "login" => "memory:/\n".to_string(),
            _ => format!("memory:/slurm_{b_node}/uid_{b_uid}/job_"),
        };
        assert!(
            out.contains(&own),
            "B's {place} does not see its own cgroup ({own}): {out}"
        );
        assert!(
            !out.contains(&format!("{marker}\n")),
            "B's {place} reads A's file: {out}"
        );
        assert!(
            !out.lines().any(|l| l.trim().starts_with(&marker)),
            "B's {place} lists A's file: {out}"
        );
        assert!(
            out.contains("/etc/passwd:0") && out.contains("/etc/group:0"),
            "B's {place} lists A's account: {out}"
        );
        assert!(
            out.contains("no-such-user"),
            "B's {place} resolves A's account: {out}"
        );
        // (A listable /run/gpufleet is an older build's doing when one runs on this
        // machine at the same time: it made the directory 0755.)
        assert!(
            out.contains("Permission denied"),
            "B's {place} lists /run/gpufleet: {out}"
        );
        assert!(
            !out.contains(&a_name) && out.contains(&b_name),
            "B's {place} lists these cluster accounts: {out}"
        );
    }

    // Space: the private temporary directories are tmpfs of a bounded size, in the login
    // and in a job (whose /tmp and /dev/shm are Slurm's).
    let sizes = |out: &str| -> Vec<(String, u64)> {
        out.lines()
            .skip(1)
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                Some((f.last()?.to_string(), f.get(1)?.parse().ok()?))
            })
            .collect()
    };
    for (place, dirs) in [
        ("login", "/tmp /var/tmp /dev/shm /run/lock"),
        ("job", "/var/tmp /run/lock"),
    ] {
        let script = format!("df -P {dirs}");
        let out = match place {
            "login" => b.ok(&script),
            _ => b.job_ok("", &script),
        };
        let found = sizes(&out);
        assert_eq!(found.len(), dirs.split(' ').count(), "{place}: {out}");
        for (at, kib) in found {
            assert_eq!(kib, 1 << 20, "the size of {at} in B's {place}: {out}");
        }
    }

    // The jobs' /tmp: a file system of 64 MiB per cluster and node that B's jobs there
    // share. A job fills it past its bound: ENOSPC; meanwhile the host's disk holds at
    // most the bound (the sparse file), the host's view of the jobs' base is empty, and
    // when the job ends the space is back for the next job.
    let image = agents
        .iter()
        .map(|a| a.data_dir().join("slurm").join(&b_name).join("jobs.img"))
        .find(|i| i.exists())
        .expect("B's jobs' /tmp file system in its agent's data dir");
    let held = || fs::metadata(&image).unwrap().blocks() * 512;
    let out_file = Path::new("/run/gpufleet")
        .join(&b_name)
        .join("home/fill.out");
    let fill = b
        .ok(&format!(
            "sbatch --parsable -N1 --output=fill.out --wrap {}",
            shell_word(
                "df -P /tmp | tail -1; dd if=/dev/zero of=/tmp/fill bs=1M count=100 2>&1; \
                 echo dd=$?; echo filled; exec sleep 3003"
            )
        ))
        .trim()
        .to_string();
    let filled = eventually("B's job filled its /tmp", LIMIT, || {
        let out = fs::read_to_string(&out_file).unwrap_or_default();
        async move { out.contains("filled").then_some(out) }
    })
    .await;
    assert!(
        filled.contains("No space left on device") && filled.contains("dd=1"),
        "a job wrote past its /tmp bound: {filled}"
    );
    let kib: u64 = filled
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse().ok())
        .unwrap_or_else(|| panic!("the job's df: {filled}"));
    assert!(
        (50 << 10..=64 << 10).contains(&kib),
        "the job's /tmp size: {filled}"
    );
    assert!(
        (40 << 20..=64 << 20).contains(&held()),
        "the host's disk holds {} bytes of B's jobs' /tmp (bound 64 MiB)",
        held()
    );
    let base_on_host: Vec<_> = agents
        .iter()
        .map(|a| a.data_dir().join("slurm").join(&b_name).join("jobs"))
        .chain(
            fs::read_dir(Path::new("/run/gpufleet").join(&b_name))
                .unwrap()
                .flatten()
                .map(|e| e.path().join("jobs")),
        )
        .flat_map(|d| fs::read_dir(d).into_iter().flatten().flatten())
        .map(|e| e.path())
        .collect();
    assert!(
        base_on_host.is_empty(),
        "job files on the host's disk: {base_on_host:?}"
    );
    b.ok(&format!("scancel {fill}"));
    eventually(
        "the filled /tmp given back to the host's disk",
        LIMIT,
        || {
            let back = held() < 8 << 20;
            async move { back.then_some(()) }
        },
    )
    .await;
    let out = b.job_ok(
        "",
        "dd if=/dev/zero of=/tmp/again bs=1M count=32 2>&1 && echo wrote",
    );
    assert!(out.contains("wrote"), "{out}");

    // The home: a file system of 64 MiB for B's cluster on this host (no team volume is
    // its home here), one mount on the host that B's login and jobs share. B fills it past
    // its bound from the login: ENOSPC, and the host's disk holds at most the bound.
    let b_agent = agents
        .iter()
        .position(|a| a.data_dir().join("slurm").join(&b_name).exists())
        .expect("B's node's agent");
    let home_image = agents[b_agent]
        .data_dir()
        .join("slurm")
        .join(&b_name)
        .join("home.img");
    let home_held = || fs::metadata(&home_image).unwrap().blocks() * 512;
    let home_mounts = || {
        let at = format!(" /run/gpufleet/homes/{b_name}/home ");
        fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&at))
            .count()
    };
    assert_eq!(home_mounts(), 1, "B's home is one mount on the host");
    let out = b.ok(
        "df -P $HOME | tail -1; dd if=/dev/zero of=$HOME/fill bs=1M count=100 2>&1; echo dd=$?",
    );
    assert!(
        out.contains("No space left on device") && out.contains("dd=1"),
        "B wrote past its home's bound: {out}"
    );
    let kib: u64 = out
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse().ok())
        .unwrap_or_else(|| panic!("the home's df: {out}"));
    assert!(
        (50 << 10..=64 << 10).contains(&kib),
        "the home's size: {out}"
    );
    assert!(
        (40 << 20..=64 << 20).contains(&home_held()),
        "the host's disk holds {} bytes of B's home (bound 64 MiB)",
        home_held()
    );
    // The job sees the login's file: one home.
    let out = b.job_ok("", "stat -c %s $HOME/fill");
    assert!(
        out.trim().parse::<u64>().is_ok_and(|n| n > 40 << 20),
        "{out}"
    );
    b.ok("rm $HOME/fill && echo kept > $HOME/kept");
    eventually(
        "the filled home given back to the host's disk",
        LIMIT,
        || {
            let back = home_held() < 16 << 20;
            async move { back.then_some(()) }
        },
    )
    .await;
    // kill -9 of B's agent, then a new one: it adopts B's daemons and orders them again
    // (its slurmd adopted says so); the home is the same mount, with B's file.
    let adopted = "adopted a daemon a former agent started";
    let before = agents[b_agent].log().matches(adopted).count();
    agents[b_agent].restart();
    wait_for_log(&agents[b_agent], adopted, before);
    assert_eq!(home_mounts(), 1, "B's home after the agent's restart");
    for (place, out) in [
        ("login", b.ok("cat $HOME/kept; df -P $HOME | tail -1")),
        ("job", b.job_ok("", "cat $HOME/kept; df -P $HOME | tail -1")),
    ] {
        assert!(
            out.starts_with("kept\n")
                && out.contains(&format!("/run/gpufleet/homes/{b_name}/home")),
            "B's {place} after the agent's restart: {out}"
        );
    }

    // One MIG slice: the job's CUDA_VISIBLE_DEVICES names it as CUDA counts the devices it
    // can open (0), and of the node's four slice devices it opens that one only.
    let gres_conf = fs::read_dir(Path::new("/run/gpufleet").join(&b_name))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("gres.conf"))
        .find(|p| p.exists())
        .expect("B's node's gres.conf");
    let devices: Vec<String> = fs::read_to_string(&gres_conf)
        .unwrap()
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("File="))
        .map(str::to_string)
        .collect();
    assert_eq!(devices.len(), 4, "{gres_conf:?}: {devices:?}");
    let opens = format!(
        "echo CVD=$CUDA_VISIBLE_DEVICES; for d in {}; do cat $d >/dev/null 2>&1 && echo $d opened || echo $d $(cat $d 2>&1 >/dev/null | sed 's/.*: //'); done",
        devices.join(" ")
    );
    let out = b.job_ok("--gres=gpu:1g.10gb:1", &opens);
    assert!(out.contains("CVD=0\n"), "{out}");
    let refused = out.matches("Operation not permitted").count();
    let reachable = out.matches("No such device or address").count();
    assert_eq!(
        (reachable, refused),
        (1, 3),
        "a one-slice job reaches its own slice's device alone (the device has no driver: \
         ENXIO) and its cgroup refuses the three others (EPERM): {out}"
    );
    // Two slices: two devices.
    let out = b.job_ok("--gres=gpu:1g.10gb:2", &opens);
    assert!(out.contains("CVD=0,1\n"), "{out}");
    assert_eq!(out.matches("No such device or address").count(), 2, "{out}");

    // Memory: a job given 64 MiB is killed when it touches 256 MiB, and runs with 512.
    let touch = "dd if=/dev/zero of=/dev/null bs=256M count=1";
    let (ok, out) = b.job("--mem=64M", touch);
    assert!(
        !ok && out.to_lowercase().contains("oom"),
        "a job used more memory than it was given: {out}"
    );
    let out = b.job_ok("--mem=512M", &format!("{touch} && echo touched"));
    assert!(out.contains("touched"), "{out}");
    // CPUs: a one-CPU job may run on one CPU only (the host has more).
    let host_cpus = std::thread::available_parallelism().unwrap().get();
    assert!(host_cpus >= 2, "this test needs a host of 2 CPUs or more");
    let out = b.job_ok("-c1", "nproc; grep Cpus_allowed_list /proc/self/status");
    assert_eq!(out.lines().next().map(str::trim), Some("1"), "{out}");

    // Destroy A: nothing of A is left on this machine; B works on.
    let dirs: Vec<PathBuf> = agents
        .iter()
        .map(|a| a.data_dir())
        .chain([backend.data_dir()])
        .collect();
    let before = leftovers(&a_name, a_uid, &a_node, &dirs);
    for seen in [
        "process",
        "file of uid",
        "mount",
        "file system",
        "loop device",
        "cgroup",
        "account",
    ] {
        assert!(
            before.iter().any(|l| l.starts_with(seen)),
            "the probe does not see A's {seen} while A runs: {before:#?}"
        );
    }
    tf.write_main(&sliced_team("b"));
    tf.apply();
    // The agent waited for A's processes before it answered, and removed the account.
    let running: Vec<_> = processes()
        .into_iter()
        .filter(|(_, u, _)| *u == Some(a_uid))
        .collect();
    assert!(
        running.is_empty(),
        "A's processes outlived its destroy: {running:#?}"
    );
    let account = Command::new("getent")
        .args(["passwd", &a_name])
        .output()
        .unwrap();
    assert!(
        !account.status.success(),
        "A's account outlived its destroy"
    );
    nothing_left("A", || leftovers(&a_name, a_uid, &a_node, &dirs));
    let out = b.job_ok("", "id -un; ls -a /tmp");
    assert!(out.contains(&b_name), "{out}");
    tf.destroy();
    nothing_left("B", || leftovers(&b_name, b_uid, &b_node, &dirs));
}

/// Waits (at most LIMIT) until `agent`'s log says `what` more than `before` times.
fn wait_for_log(agent: &NodeAgent, what: &str, before: usize) {
    let deadline = std::time::Instant::now() + LIMIT;
    while agent.log().matches(what).count() <= before {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent's log does not say {what:?} again: {}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// On a failure, the Slurm daemons' logs under these data dirs go to the test's output.
struct SlurmLogs(Vec<PathBuf>);

impl Drop for SlurmLogs {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for f in self.0.iter().flat_map(|d| walk_logs(d)) {
            let text = fs::read_to_string(&f).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!("==== {} (last lines)", f.display());
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

fn walk_logs(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk_logs(&p));
        } else if p.extension().is_some_and(|x| x == "log") {
            out.push(p);
        }
    }
    out
}
