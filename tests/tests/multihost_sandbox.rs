//! Two teams' Slurm clusters on the multi-host tier (issue 28, items 2 to 4): each team's
//! node on a GPU host of its own, which also runs the team's controller and login (the
//! cluster's head), each team with only its own key, working from the client host. From
//! team B's login and job, nothing of team A is in sight: no process (B's login and job
//! run on a host apart, whose process table has none of A's, and the control plane's host
//! runs nothing of either), no file of A's login's or job's `/tmp` and `/dev/shm`, no
//! account of A; a one-slice job opens its own slice's device only. Destroying A's cluster
//! leaves nothing of A on any host: no process, no file of its uid in any host's `/tmp`,
//! `/var/tmp`, `/dev/shm` or `/run`, no mount naming it, no cgroup of its node, no
//! account.
//!
//! Needs root with namespaces and cgroup v1 (as CI runs); without them it fails saying so.

use std::fs;
use std::time::Duration;

use gpufleet_e2e::multihost::{Fleet, ONE_GPU_HOST};
use gpufleet_e2e::netns::{self, Host};
use gpufleet_e2e::slurm_login::{credentials, shell_word, sliced_team, team_key, Session};
use gpufleet_e2e::{eventually, Terraform};

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(90);
const GPU_HOSTS: [&str; 2] = ["ga", "gb"];
/// What each login on a GPU host may use, all its sessions together.
const LOGIN_LIMITS: [&str; 6] = [
    "--login-memory-mib",
    "256",
    "--login-pids",
    "200",
    "--login-cpus",
    "1",
];

fn uid_of(pid: u32) -> Option<u32> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// What of cluster `name` (account `uid`, Slurm node `node`) host `host` still holds.
fn leftovers(host: &Host, name: &str, uid: u32, node: &str) -> Vec<String> {
    let at = host.name();
    let mut left: Vec<String> = host
        .processes()
        .into_iter()
        .filter(|(p, _)| uid_of(*p) == Some(uid))
        .map(|(p, comm)| format!("{at}: process {p} {comm}"))
        .collect();
    let owned = host.run(
        "find",
        &[
            "/tmp",
            "/var/tmp",
            "/dev/shm",
            "/run",
            "-uid",
            &uid.to_string(),
        ],
    );
    left.extend(
        String::from_utf8_lossy(&owned.stdout)
            .lines()
            .map(|l| format!("{at}: file of uid {uid}: {l}")),
    );
    let named = host.run("find", &["/run", "-name", &format!("*{name}*")]);
    left.extend(
        String::from_utf8_lossy(&named.stdout)
            .lines()
            .map(|l| format!("{at}: {l}")),
    );
    // Every mount of every process of the host (its own /proc shows its own).
    let mounts = host.run("sh", &["-c", "cat /proc/[0-9]*/mountinfo 2>/dev/null"]);
    left.extend(
        String::from_utf8_lossy(&mounts.stdout)
            .lines()
            .filter(|l| l.contains(name))
            .map(|l| format!("{at}: mount {l}")),
    );
    if host
        .run("getent", &["passwd", &uid.to_string()])
        .status
        .success()
    {
        left.push(format!("{at}: account {uid}"));
    }
    left.extend(cgroups_of(name, node));
    left
}

/// The cgroups of cluster `name` on this machine: Slurm's of its node `node` (of an older
/// agent), its nodes' slurmd's and its logins' (named `gpufleet_slurmd_<cluster>_<node
/// part>` and `gpufleet_login_<cluster>_<node part>`).
fn cgroups_of(name: &str, node: &str) -> Vec<String> {
    let login = format!("gpufleet_login_{name}_");
    let slurmd = format!("gpufleet_slurmd_{name}_");
    let slurm = format!("slurm_{node}");
    fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .flat_map(|controller| {
            fs::read_dir(controller.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .filter(|e| {
            let n = e.file_name().to_string_lossy().to_string();
            n == slurm || n.starts_with(&login) || n.starts_with(&slurmd)
        })
        .map(|e| format!("cgroup {}", e.path().display()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_hosts_apart_one_team_sees_nothing_of_another_and_destroy_leaves_nothing() {
    netns::require("the multi-host tests");
    let Fleet {
        net,
        backend,
        agents,
    } = Fleet::start(
        &GPU_HOSTS,
        &[],
        &[&ONE_GPU_HOST[..], &LOGIN_LIMITS[..]].concat(),
        LIMIT,
    )
    .await;
    let (cp, client) = (net.host("cp"), net.host("client"));
    let (a_key, a_pub) = team_key(client, "a");
    let (b_key, b_pub) = team_key(client, "b");
    let tf = Terraform::on_host(client, &backend, backend.admin_token());
    tf.keep_credentials_in_state(); // reads the deprecated attributes
    tf.write_file("a.pub", &a_pub);
    tf.write_file("b.pub", &b_pub);
    tf.write_main(&format!("{}{}", sliced_team("a"), sliced_team("b")));
    tf.init();
    tf.apply();
    let (a_creds, b_creds) = (
        credentials(&tf, "gpufleet_tenant_cluster.a"),
        credentials(&tf, "gpufleet_tenant_cluster.b"),
    );
    let (a, b) = (
        Session::new(client, &a_creds, &a_key),
        Session::new(client, &b_creds, &b_key),
    );
    let a_name = a_creds["user"].as_str().unwrap().to_string();
    let b_name = b_creds["user"].as_str().unwrap().to_string();
    let a_uid: u32 = a.ok("id -u").trim().parse().unwrap();
    let node_of = |address: &str| {
        tf.resource(address)["nodes"][0]["hostname"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (a_node, b_node) = (
        node_of("gpufleet_tenant_cluster.a"),
        node_of("gpufleet_tenant_cluster.b"),
    );
    assert_ne!(a_node, b_node, "each team's node is on a host of its own");
    let (a_host, b_host) = (net.host(&a_node), net.host(&b_node));
    let marker = format!("secret-of-a-{}", std::process::id());

    // A: files in its login's /tmp and /dev/shm, a process left on its login, and a job
    // on its node that writes to its own /tmp and /dev/shm and waits.
    a.ok(&format!(
        "echo {marker} > /tmp/{marker} && echo {marker} > /dev/shm/{marker}"
    ));
    a.ok("setsid sh -c 'exec sleep 3001' </dev/null >/dev/null 2>&1 &");
    let job = a
        .ok(&format!(
            "sbatch --parsable -N1 --output=/dev/null --wrap {}",
            shell_word(&format!(
                "echo {marker} > /tmp/{marker}-job; echo {marker} > /dev/shm/{marker}-job; exec sleep 3002"
            ))
        ))
        .trim()
        .to_string();
    eventually("A's job running", LIMIT, || {
        let state = a.run(&format!("squeue -h -j {job} -o %T")).1;
        async move { (state.trim() == "RUNNING").then_some(()) }
    })
    .await;
    let running_of_a = |host: &Host| {
        host.processes()
            .into_iter()
            .filter(|(p, _)| uid_of(*p) == Some(a_uid))
            .count()
    };
    // A's login is on A's node: its session's process and its job's run there.
    assert_eq!(a_creds["login_node"].as_str(), Some(a_node.as_str()));
    eventually("A's processes on its node's host", LIMIT, || {
        let there = running_of_a(a_host) >= 2;
        async move { there.then_some(()) }
    })
    .await;
    // The control plane's host has none of A's processes, nor any team's daemon.
    assert_eq!(running_of_a(cp), 0);
    let on_cp = cp.run("ps", &["-eo", "comm"]);
    let on_cp = String::from_utf8_lossy(&on_cp.stdout).to_string();
    for d in ["slurmctld", "slurmd", "sshd", "munged"] {
        assert!(!on_cp.lines().any(|l| l.trim() == d), "{on_cp}");
    }
    // B's node's host, a machine apart, has none of A's processes in its process table.
    let on_b_host = b_host.run("ps", &["-eo", "uid,args"]);
    let on_b_host = String::from_utf8_lossy(&on_b_host.stdout).to_string();
    assert!(
        !on_b_host.contains("sleep 300") && !on_b_host.contains(&a_uid.to_string()),
        "{on_b_host}"
    );

    for (place, out) in [
        ("login", b.ok("ps -eo uid,user:32,args")),
        ("job", b.job_ok("", "ps -eo uid,user:32,args")),
    ] {
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
        ] {
            assert!(!out.contains(never), "B's {place} sees {never}: {out}");
        }
    }
    let probe = format!(
        "ls -a /tmp /dev/shm; cat /tmp/{marker}* /dev/shm/{marker}* 2>&1; \
         grep -c {a_name} /etc/passwd /etc/group; getent passwd {a_name} {a_uid} || echo no-such-user; \
         grep ^gf /etc/passwd | cut -d: -f1"
    );
    for (place, out) in [("login", b.ok(&probe)), ("job", b.job_ok("", &probe))] {
        assert!(
            !out.lines().any(|l| l.trim().starts_with(&marker)),
            "B's {place} reads or lists A's files: {out}"
        );
        assert!(
            out.contains("/etc/passwd:0") && out.contains("/etc/group:0"),
            "B's {place} lists A's account: {out}"
        );
        assert!(out.contains("no-such-user"), "B's {place}: {out}");
        assert!(
            out.contains(&b_name),
            "B's {place} lacks its own account: {out}"
        );
    }

    // One MIG slice on B's node: its own device opens (as far as the missing driver),
    // the node's other three are refused by the job's device cgroup.
    let gres = b_host.run(
        "sh",
        &["-c", &format!("cat /run/gpufleet/{b_name}/n*/gres.conf")],
    );
    let devices: Vec<String> = String::from_utf8_lossy(&gres.stdout)
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("File="))
        .map(str::to_string)
        .collect();
    assert_eq!(devices.len(), 4, "{devices:?}");
    let out = b.job_ok(
        "--gres=gpu:1g.10gb:1",
        &format!(
            "echo CVD=$CUDA_VISIBLE_DEVICES; for d in {}; do cat $d 2>&1 >/dev/null; done; true",
            devices.join(" ")
        ),
    );
    assert!(out.contains("CVD=0\n"), "{out}");
    assert_eq!(
        (
            out.matches("No such device or address").count(),
            out.matches("Operation not permitted").count()
        ),
        (1, 3),
        "{out}"
    );

    // B's login, all its sessions together, is held to its host's login limits, in the
    // login's own cgroups: past 256 MiB a session's process is killed and the login
    // answers on; a fork bomb stops at 200 processes; one CPU's worth of time. The node's
    // agent is in none of them.
    let cgroups = b.ok("cat /proc/self/cgroup");
    let path_of = |controller: &str| {
        cgroups.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':').skip(1);
            let (kinds, path) = (parts.next()?, parts.next()?);
            kinds
                .split(',')
                .any(|k| k == controller)
                .then(|| path.to_string())
        })
    };
    // The login's cgroup is the root of its cgroup namespace, and of the cgroupfs it sees
    // (the host's name for it, named by its cluster and node, is out of its sight).
    for controller in ["memory", "pids", "cpu"] {
        assert_eq!(
            path_of(controller).as_deref(),
            Some("/"),
            "B's session is not at the root of its login's {controller} cgroup: {cgroups}"
        );
    }
    let limits = b.ok(
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/cpu/cpu.cfs_quota_us",
    );
    assert_eq!(limits, "268435456\n200\n100000\n");
    let own = fs::read_dir("/sys/fs/cgroup/pids")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .find(|n| n.starts_with(&format!("gpufleet_login_{b_name}_n")))
        .expect("B's login's pids cgroup on the host");
    // tail keeps a line without an end in memory: 400 MiB of one.
    let out = b.ok("head -c 400m /dev/zero | tail -n 1 >/dev/null; echo tail=$?");
    assert!(
        out.contains("tail=137"),
        "not killed past the login's memory: {out}"
    );
    assert_eq!(
        b.ok("id -un").trim(),
        b_name,
        "the login answers after the kill"
    );
    let (ok, out) = b.run(
        "sh -c 'i=0; while [ $i -lt 400 ]; do sleep 3 & i=$((i+1)); done; wait; echo forked-all'",
    );
    assert!(
        !ok && !out.contains("forked-all") && out.contains("fork"),
        "400 processes started past the login's 200: {out}"
    );
    let pids_now = format!("/sys/fs/cgroup/pids/{own}/pids.current");
    eventually("the bomb's processes ended", LIMIT, || {
        let now: u32 = fs::read_to_string(&pids_now)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        async move { (now <= 10).then_some(()) }
    })
    .await;
    assert_eq!(
        b.ok("id -un").trim(),
        b_name,
        "the login answers after the bomb"
    );
    let b_agent = GPU_HOSTS.iter().position(|h| *h == b_node).unwrap();
    let agent_cgroups =
        fs::read_to_string(format!("/proc/{}/cgroup", agents[b_agent].pid().unwrap())).unwrap();
    assert!(!agent_cgroups.contains("gpufleet_login"), "{agent_cgroups}");

    // Destroy A: nothing of A on any host.
    let hosts: Vec<&Host> = net.hosts().iter().collect();
    let before: Vec<String> = hosts
        .iter()
        .flat_map(|h| leftovers(h, &a_name, a_uid, &a_node))
        .collect();
    assert!(
        before.iter().any(|l| l.contains("process"))
            && before.iter().any(|l| l.contains("account"))
            && before.iter().any(|l| l.contains("mount"))
            && before.iter().any(|l| l.contains("gpufleet_login_")),
        "the probe does not see A while it runs: {before:#?}"
    );
    tf.write_main(&sliced_team("b"));
    tf.apply();
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        let left: Vec<String> = hosts
            .iter()
            .flat_map(|h| leftovers(h, &a_name, a_uid, &a_node))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "left of team A after its cluster was destroyed: {left:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // A's GPU host runs its agent alone again; B works on.
    let a_agent = GPU_HOSTS.iter().position(|h| *h == a_node).unwrap();
    assert_eq!(
        a_host
            .processes()
            .iter()
            .map(|(p, _)| *p)
            .collect::<Vec<_>>(),
        vec![agents[a_agent].pid().unwrap()]
    );
    assert!(b.job_ok("", "id -un").contains(&b_name));
    tf.destroy();
}
