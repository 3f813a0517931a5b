//! The jobs' bounded /tmp (`crate::job_tmp`) through a real sandbox: what a job writes,
//! what the host sees, and how long the loop device lives.

use super::Sandbox;
use crate::job_tmp::*;
use std::io::{BufRead, Write};
use std::path::Path;
use std::process::{Command, Stdio};

/// The loop devices whose file is `image` now (read from sysfs, opening none).
fn devices_of(image: &Path) -> Vec<String> {
    std::fs::read_dir("/sys/block")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("loop/backing_file"))
                .is_ok_and(|b| b.trim_end().trim_end_matches(" (deleted)") == image.as_os_str())
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// `script` in a sh started in `sandbox`, stdin and stdout piped.
fn start(sandbox: &Sandbox, script: &str) -> std::process::Child {
    let prepared = sandbox.prepare().unwrap();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    // SAFETY: enter makes system calls only.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || prepared.enter());
    }
    cmd.spawn().unwrap()
}

/// Needs root, mkfs.ext4 and loop devices (as CI has): a node's jobs' /tmp space holds
/// its bound and no more (ENOSPC past it, while the host's disk beside it takes
/// writes), is seen in the daemon's namespace only (the host's base stays an empty
/// directory, no mount of it on the host), is shared by a daemon started while the
/// first still holds it (one loop device, one file system), gives back on the host's
/// disk what is deleted, and its loop device goes when the last namespace ends.
#[test]
fn jobs_tmp_space_is_bounded_private_to_the_namespace_shared_and_gone_with_it() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "loop devices and mounts need root, as CI runs"
    );
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("jobs");
    std::fs::create_dir(&base).unwrap();
    let space = JobTmp::new(dir.path(), &base, MIN_MIB);
    assert!(space.image.is_absolute() && space.image.ends_with(IMAGE));
    let sandbox = Sandbox {
        job_tmp: Some(space.clone()),
        ..Sandbox::default()
    };
    let b = base.display();
    let outside = dir.path().join("outside");
    // The first: fills its space past the bound, then writes beside it on the host's
    // disk, then waits.
    let mut first = start(
        &sandbox,
        &format!(
            "df -P {b} | tail -1; stat -c 'mode=%a uid=%u' {b}; \
             dd if=/dev/zero of={b}/fill bs=1M count={} 2>&1; echo dd=$?; \
             dd if=/dev/zero of={} bs=1M count=1 2>/dev/null; echo outside=$?; echo END; read go",
            MIN_MIB * 2,
            outside.display()
        ),
    );
    let mut out = std::io::BufReader::new(first.stdout.take().unwrap());
    let mut said = String::new();
    while !said.ends_with("END\n") {
        assert_ne!(out.read_line(&mut said).unwrap(), 0, "{said}");
    }
    assert!(said.contains("mode=700 uid=0"), "{said}");
    assert!(
        said.contains("No space left on device") && said.contains("dd=1"),
        "{said}"
    );
    assert!(said.contains("outside=0"), "{said}");
    let size_kib: u64 = said
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    assert!(
        size_kib <= MIN_MIB << 10 && size_kib > (MIN_MIB << 10) * 8 / 10,
        "{said}"
    );
    // The host: an empty base, no mount at it, the image no larger than its bound.
    assert_eq!(std::fs::read_dir(&base).unwrap().count(), 0);
    let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!host.contains(&format!(" {b} ")), "{host}");
    use std::os::unix::fs::MetadataExt;
    let held = || std::fs::metadata(&space.image).unwrap().blocks() * 512;
    assert!(held() <= MIN_MIB << 20, "{}", held());
    assert_eq!(devices_of(&space.image).len(), 1);
    // A second daemon while the first holds it: the same file system (the first's
    // file is there), on the same loop device; deleting gives the disk back.
    let second = start(
        &sandbox,
        &format!("ls {b}; rm {b}/fill; sync; df -P {b} | tail -1"),
    )
    .wait_with_output()
    .unwrap();
    let second = String::from_utf8_lossy(&second.stdout);
    assert!(second.contains("fill"), "{second}");
    assert_eq!(devices_of(&space.image).len(), 1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while held() > 8 << 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "still {} bytes",
            held()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    writeln!(first.stdin.take().unwrap(), "go").unwrap();
    assert!(first.wait().unwrap().success());
    // Both namespaces ended: the loop device went with their mounts.
    while !devices_of(&space.image).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            devices_of(&space.image)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Unused: made afresh (empty) at the next start.
    let third = start(&sandbox, &format!("ls -A {b}"))
        .wait_with_output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&third.stdout), "lost+found\n");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !devices_of(&space.image).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            devices_of(&space.image)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
