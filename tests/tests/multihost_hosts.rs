//! The multi-host tier's hosts are machines apart (issue 28, item 4): each has its own
//! PID namespace and `/proc` (a host's `ps` shows its own processes only), its own
//! `/tmp`, `/var/tmp` and `/dev/shm`, and its own mounts; the harness's directory is the
//! one thing they share, as a test's fixture. A long-lived process started on a host is the
//! harness's own child (its pid is this machine's number, and signals reach it), and lives
//! in the host's PID namespace.
//!
//! Needs root with namespaces, as CI runs; without it the test fails saying so.

use std::fs;

use gpufleet_e2e::netns::{self, Host, Network};

fn sh(host: &Host, script: &str) -> (bool, String) {
    let out = host.run("sh", &["-c", script]);
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn ok(host: &Host, script: &str) -> String {
    let (ok, out) = sh(host, script);
    assert!(ok, "{}: {script}: {out}", host.name());
    out
}

#[test]
fn each_host_has_its_own_processes_temporary_directories_and_mounts() {
    netns::require("the multi-host tests");
    let net = Network::new(&["a", "b"]);
    let (a, b) = (net.host("a"), net.host("b"));

    // A long-lived process on b: the harness's child, in b's PID namespace.
    let mut sleeper = b
        .launcher()
        .spawn(b.launcher().daemon("sleep").arg("3003"))
        .expect("spawn on b");
    let status = fs::read_to_string(format!("/proc/{}/status", sleeper.id())).unwrap();
    let nspid: Vec<&str> = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        nspid.len(),
        2,
        "the process is not in a PID namespace of its own: {nspid:?}"
    );
    assert!(b.pids().contains(&sleeper.id()));
    // b's ps shows it, with its init as pid 1; a's ps shows neither.
    let on_b = ok(b, "ps -eo pid,args");
    assert!(on_b.contains("sleep 3003"), "{on_b}");
    assert!(
        on_b.lines()
            .any(|l| l.trim().starts_with("1 ") && l.contains("sleep while 1")),
        "b's pid 1 is not its init: {on_b}"
    );
    let on_a = ok(a, "ps -eo pid,args");
    assert!(!on_a.contains("sleep 3003"), "a sees b's process: {on_a}");
    let machine = std::process::Command::new("ps")
        .args(["-eo", "pid,args"])
        .output()
        .unwrap();
    assert!(
        on_a.lines().count() < String::from_utf8_lossy(&machine.stdout).lines().count(),
        "a sees as many processes as this machine: {on_a}"
    );
    // Signals reach it: killed, it is gone from b.
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    assert!(!ok(b, "ps -eo args").contains("sleep 3003"));

    // Temporary directories: a's files are a's alone.
    let marker = format!("gfmh-{}", std::process::id());
    for dir in ["/tmp", "/var/tmp", "/dev/shm"] {
        ok(a, &format!("echo a > {dir}/{marker}"));
        let (seen, out) = sh(b, &format!("cat {dir}/{marker}"));
        assert!(!seen, "b reads a's {dir}/{marker}: {out}");
        assert!(
            !std::path::Path::new(dir).join(&marker).exists(),
            "a's {dir}/{marker} is in this machine's {dir}"
        );
        assert_eq!(ok(a, &format!("cat {dir}/{marker}")).trim(), "a");
    }
    // Mounts: a tmpfs a mounts is a's alone.
    ok(
        a,
        &format!("mkdir -p /tmp/{marker}.m && mount -t tmpfs tmpfs /tmp/{marker}.m"),
    );
    assert!(ok(a, "cat /proc/self/mountinfo").contains(&format!("/tmp/{marker}.m")));
    let b_mounts = ok(b, "cat /proc/self/mountinfo");
    assert!(!b_mounts.contains(&format!("{marker}.m")), "{b_mounts}");
    let here = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!here.contains(&format!("{marker}.m")), "{here}");

    // What they share: the harness's directory, at its own path on every host.
    let shared = a.dir().join("from-the-harness");
    fs::write(&shared, "fixture").unwrap();
    for host in [a, b] {
        let out = ok(host, &format!("cat {}", shared.display()));
        assert_eq!(out.trim(), "fixture", "{}", host.name());
    }
    // And the cgroup hierarchies Slurm confines jobs with.
    for controller in ["cpuset", "memory", "devices", "freezer"] {
        ok(
            b,
            &format!("test -e /sys/fs/cgroup/{controller}/cgroup.procs"),
        );
    }
    drop(net);
}
