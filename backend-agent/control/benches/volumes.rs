//! What team volumes cost (issue 28): on a sparse btrfs image loop-mounted for the run
//! (standing for the platform's shared storage), the time `Volumes::create` takes for a
//! volume of 1, 100 and 1,000 GiB (a subvolume, its quota group's limit, owner and mode)
//! and the time `Volumes::resize` takes to double it (online: the limit rises); then the
//! throughput of one `dd` writing `WRITE_MIB` MiB (fsynced) into a team volume against the
//! same `dd` into the backing file system outside any volume, alternated `ROUNDS` times in
//! the same run. Prints tables; nothing is asserted.
//!
//! `cargo bench -p gpufleet-control --bench volumes`
//! Environment: `WRITE_MIB` (default 1024), `ROUNDS` (default 3), `DIR` (where the image
//! goes; default a temp dir, so the disk under it is the one measured). Needs root,
//! `mkfs.btrfs`/`btrfs` (Debian's btrfs-progs) and loop devices; fails naming what is
//! missing. The image is unmounted and removed at the end, and on a panic.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gpufleet_control::volumes::Volumes;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn must(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e} (btrfs-progs installed?)"));
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The loop-mounted btrfs, unmounted (freeing its loop device) and removed on drop.
struct Backing {
    _dir: tempfile::TempDir,
    mount: PathBuf,
}

impl Backing {
    fn new(gib: u64) -> Backing {
        // SAFETY: geteuid has no preconditions.
        assert!(
            unsafe { libc::geteuid() } == 0,
            "the volumes bench needs root (it loop-mounts a btrfs image)"
        );
        let dir = match std::env::var_os("DIR") {
            Some(d) => tempfile::tempdir_in(d),
            None => tempfile::tempdir(),
        }
        .expect("a temp dir for the image");
        let image = dir.path().join("shared.img");
        let mount = dir.path().join("shared");
        std::fs::create_dir(&mount).unwrap();
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(gib << 30))
            .expect("a sparse image");
        let image = image.display().to_string();
        must("mkfs.btrfs", &["-q", "-f", &image]);
        must(
            "mount",
            &["-o", "loop", &image, &mount.display().to_string()],
        );
        Backing { _dir: dir, mount }
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        let m = self.mount.display().to_string();
        let ok = Command::new("umount")
            .arg(&m)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").args(["-l", &m]).status();
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// One fsynced `dd` of `mib` MiB into `file`; MiB/s.
fn dd(file: &Path, mib: u64) -> f64 {
    let start = Instant::now();
    must(
        "dd",
        &[
            "if=/dev/zero",
            &format!("of={}", file.display()),
            "bs=1M",
            &format!("count={mib}"),
            "conv=fsync",
            "status=none",
        ],
    );
    let rate = mib as f64 / start.elapsed().as_secs_f64();
    std::fs::remove_file(file).unwrap();
    rate
}

fn main() {
    let (write_mib, rounds) = (env_u64("WRITE_MIB", 1024), env_u64("ROUNDS", 3));
    // Room for every size below and its doubling, sparse: it takes what is written.
    let backing = Backing::new(4096);
    let volumes = Volumes::shared(&backing.mount).expect("shared storage on the image");

    println!("volume create and grow (btrfs subvolume + qgroup limit), one volume per size");
    println!(
        "{:>10} {:>12} {:>16} {:>12}",
        "size GiB", "create ms", "grow to 2x ms", "used GiB"
    );
    for gib in [1_i64, 100, 1000] {
        let dir = volumes.path("bench", &format!("v{gib}"));
        let start = Instant::now();
        volumes
            .create(&dir, gib, Some(1_900_000_000))
            .expect("create");
        let created = start.elapsed();
        let start = Instant::now();
        volumes.resize(&dir, gib * 2).expect("grow");
        let grown = start.elapsed();
        let used = volumes.used_gib(&dir).expect("used");
        println!("{gib:>10} {:>12} {:>16} {used:>12}", ms(created), ms(grown));
    }

    let team = volumes.path("bench", "team");
    volumes.create(&team, 8, None).expect("the team volume");
    let plain = backing.mount.join("plain");
    std::fs::create_dir(&plain).unwrap();
    println!();
    println!("dd of {write_mib} MiB (bs=1M, conv=fsync), alternated, same run");
    println!(
        "{:>6} {:>20} {:>22}",
        "round", "team volume MiB/s", "backing storage MiB/s"
    );
    let (mut sum_team, mut sum_plain) = (0.0, 0.0);
    for round in 1..=rounds {
        let t = dd(&team.join("f"), write_mib);
        let p = dd(&plain.join("f"), write_mib);
        sum_team += t;
        sum_plain += p;
        println!("{round:>6} {t:>20.0} {p:>22.0}");
    }
    let n = rounds.max(1) as f64;
    println!(
        "{:>6} {:>20.0} {:>22.0}   (team / backing: {:.2})",
        "mean",
        sum_team / n,
        sum_plain / n,
        sum_team / sum_plain.max(f64::MIN_POSITIVE)
    );
    for gib in [1, 100, 1000] {
        let _ = volumes.remove(&volumes.path("bench", &format!("v{gib}")));
    }
    let _ = volumes.remove(&team);
}
