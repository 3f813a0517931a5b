//! The space a node's jobs write their `/tmp` to, bounded: Slurm 22.05's
//! `job_container/tmpfs` bind-mounts a directory under its `BasePath` as each job's `/tmp`,
//! with no size of its own (Debian's 22.05 has no `Dirs=` or size option), so without a
//! bound one team's jobs could fill the host's disk. Here the `BasePath` is, in the node's
//! slurmd namespace (and so in every job's), an ext4 file system of its own: a sparse file
//! `<agent-data-dir>/slurm/<cluster>/jobs.img` of the agent's `--job-tmp-mib`,
//! loop-mounted there. The cluster's jobs on this node, all together, write at most that;
//! past it a write fails with ENOSPC ("No space left on device") on that file system
//! alone, and the host's disk holds only what they hold (the file is sparse and mounted
//! with `discard`, so what a job deletes, or Slurm removes at its end, goes back).
//!
//! - Where: mounted between fork and exec, inside slurmd's namespace, like the sandbox's
//!   other mounts: nothing is mounted on the host (whose `BasePath` stays an empty 0700
//!   directory), and no other team's namespace lists it. The file system's root is root's,
//!   0700, as the directory was.
//! - Loop device: attached with autoclear before fork and held by the agent until the
//!   child has mounted it; it then goes with its last mount, i.e. when slurmd's namespace
//!   and every job's namespace made from it have ended. A slurmd started while an earlier
//!   one's jobs still hold the file system (a restart with a new configuration) mounts
//!   the same loop device, so its jobs and the older ones share one file system and one
//!   bound; one never mounts a second device on the same file.
//! - Lifetime: made afresh (an empty file system of the current size) whenever no loop
//!   device holds it: the jobs' `/tmp` are scratch that Slurm removes at each job's end.
//!   The file goes with the cluster's directory when the cluster leaves the node (and by
//!   `node --clean`); its loop device when the cluster's last process on the node ends.
//!
//! Blocking (mkfs.ext4, ioctls): called where the daemons are started, off the async
//! workers.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::mount::{cpath, cstring, Mount};

/// The default bound of one cluster's jobs' `/tmp` on one node (`node --job-tmp-mib`).
pub const DEFAULT_MIB: u64 = 16 * 1024;
/// The smallest bound the flag takes: an ext4 of less is mostly its own metadata.
pub const MIN_MIB: u64 = 64;
/// The largest bound the flag takes (64 TiB).
pub const MAX_MIB: u64 = 64 << 20;
/// The name of the file system's file in the cluster's directory of the agent.
pub const IMAGE: &str = "jobs.img";

/// A node's jobs' `/tmp` space: the file `image` of `bytes`, mounted at `base` (the
/// `BasePath` of job_container.conf) in the namespace of the daemon that runs them.
#[derive(Clone, Debug, PartialEq)]
pub struct JobTmp {
    pub image: PathBuf,
    pub base: PathBuf,
    pub bytes: u64,
}

/// The file system attached to a loop device this process holds open, and its mount,
/// ready to run in the child between fork and exec.
pub(crate) struct Attached {
    /// Held until the child has mounted the device (dropped after spawn).
    _device: OwnedFd,
    mount: Mount,
}

// linux/loop.h
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// struct loop_info64.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// struct loop_config.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// How many free loop devices are tried before giving up (another process may take the
/// one the kernel offered first).
const ATTACH_TRIES: usize = 16;

impl JobTmp {
    /// The jobs' space of a cluster whose agent directory is `dir` (canonical: loop
    /// devices name their file by its full path), mounted at `base`, of `mib` MiB.
    pub fn new(dir: &Path, base: &Path, mib: u64) -> JobTmp {
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        JobTmp {
            image: dir.join(IMAGE),
            base: base.to_path_buf(),
            bytes: mib.saturating_mul(1 << 20),
        }
    }

    /// Holds a loop device of the image: the one that holds it already (its file system
    /// is still mounted in an earlier namespace), else a new one of an image made afresh.
    pub(crate) fn attach(&self) -> std::io::Result<Attached> {
        let (device, path) = match self.held()? {
            Some(held) => held,
            None => {
                self.make()?;
                self.attach_new()?
            }
        };
        Ok(Attached {
            _device: device,
            mount: Mount {
                source: cstring(&path)?,
                target: cpath(&self.base)?,
                fstype: Some(cstring("ext4")?),
                flags: libc::MS_NOSUID | libc::MS_NODEV,
                // noinit_itable: no background zeroing of inode tables (which would fill
                // the sparse file); discard: what is deleted leaves the host's disk.
                data: Some(cstring("noinit_itable,discard")?),
            },
        })
    }

    /// The loop device that holds this image (the same file, by device and inode), opened.
    fn held(&self) -> std::io::Result<Option<(OwnedFd, String)>> {
        use std::os::unix::fs::MetadataExt;
        let Ok(meta) = std::fs::metadata(&self.image) else {
            return Ok(None);
        };
        let Ok(blocks) = std::fs::read_dir("/sys/block") else {
            return Ok(None);
        };
        for entry in blocks.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file"))
            else {
                continue;
            };
            if Path::new(backing.trim_end_matches('\n')) != self.image {
                continue;
            }
            let path = format!("/dev/{name}");
            // Gone meanwhile (its last user let go): not this one.
            let Ok(fd) = open(&path, libc::O_RDWR) else {
                continue;
            };
            // SAFETY: a zeroed loop_info64 is a valid out-parameter of this ioctl.
            let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
            let rc = unsafe { libc::ioctl(fd.as_raw_fd(), LOOP_GET_STATUS64 as _, &mut info) };
            if rc == 0 && info.lo_inode == meta.ino() && info.lo_device == meta.dev() {
                return Ok(Some((fd, path)));
            }
        }
        Ok(None)
    }

    /// A sparse file of `bytes` with an empty ext4 on it (no journal: scratch made afresh
    /// whenever unused; no blocks reserved for root), at `image` once whole.
    fn make(&self) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let new = self.image.with_extension("img.new");
        let made = (|| {
            let _ = std::fs::remove_file(&new);
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&new)?;
            file.set_len(self.bytes)?;
            drop(file);
            let out = std::process::Command::new("mkfs.ext4")
                .args(["-q", "-F", "-m", "0", "-O", "^has_journal", "-E"])
                .arg("lazy_itable_init=1,nodiscard")
                .arg(&new)
                .stdin(std::process::Stdio::null())
                .output()
                .map_err(|e| std::io::Error::other(format!("mkfs.ext4: {e}")))?;
            if !out.status.success() {
                return Err(std::io::Error::other(format!(
                    "mkfs.ext4 {}: {}",
                    new.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            std::fs::rename(&new, &self.image)
        })();
        if made.is_err() {
            let _ = std::fs::remove_file(&new);
        }
        made.map_err(|e| {
            std::io::Error::other(format!(
                "making the jobs' /tmp space {}: {e}",
                self.image.display()
            ))
        })
    }

    /// A free loop device configured on the image with autoclear, opened.
    fn attach_new(&self) -> std::io::Result<(OwnedFd, String)> {
        let file = open(&self.image.display().to_string(), libc::O_RDWR)?;
        let control = open("/dev/loop-control", libc::O_RDWR)?;
        let mut last = std::io::Error::other("no free loop device");
        for _ in 0..ATTACH_TRIES {
            // SAFETY: an ioctl without an argument on the control device.
            let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
            if n < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let path = format!("/dev/loop{n}");
            let device = match open(&path, libc::O_RDWR) {
                Ok(d) => d,
                Err(e) => {
                    last = e;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    continue;
                }
            };
            // SAFETY: a zeroed loop_config is valid; the fields set are plain data.
            let mut config: LoopConfig = unsafe { std::mem::zeroed() };
            config.fd = file.as_raw_fd() as u32;
            config.info.lo_flags = LO_FLAGS_AUTOCLEAR;
            let name = self.image.as_os_str().as_encoded_bytes();
            let len = name.len().min(config.info.lo_file_name.len() - 1);
            config.info.lo_file_name[..len].copy_from_slice(&name[..len]);
            // SAFETY: the device is open; config outlives the call.
            if unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CONFIGURE as _, &config) } == 0 {
                return Ok((device, path));
            }
            // EBUSY: another process configured it first.
            last = std::io::Error::last_os_error();
        }
        Err(std::io::Error::other(format!(
            "attaching {} to a loop device: {last}",
            self.image.display()
        )))
    }
}

impl Attached {
    /// In the child, between fork and exec: mounts the file system at the base, root's
    /// and 0700. System calls only.
    ///
    /// # Safety
    /// Between fork and exec (as the sandbox's setup runs).
    pub(crate) unsafe fn enter(&self) -> std::io::Result<()> {
        // SAFETY: NUL-terminated strings owned by self.
        unsafe {
            self.mount.run()?;
            if libc::chmod(self.mount.target.as_ptr(), 0o700) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// open(2) with O_CLOEXEC.
fn open(path: &str, flags: libc::c_int) -> std::io::Result<OwnedFd> {
    let c = CString::new(path).map_err(|_| std::io::Error::other("a NUL in a path"))?;
    // SAFETY: a NUL-terminated path; the descriptor returned is owned here.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a descriptor just opened and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
