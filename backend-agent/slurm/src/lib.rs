//! Real Slurm for tenant clusters with `orchestrator = "slurm"`, as processes on a host: the
//! configuration every party of a cluster shares and each daemon's own lines (`conf`),
//! munge keys and daemons (`munge`), the supervised processes (`daemon`), the
//! controller's view of its nodes (`status`), each cluster's own unprivileged account and
//! runtime directory on a host (`account`), its login endpoint and host key (`login`),
//! the mount namespace the daemons that serve a tenant run in (`sandbox`), the bounded
//! space of a node's jobs' `/tmp` in it (`job_tmp`), the bounded home of a cluster on a host
//! without a team volume to be it (`home_fs`), with the cgroups
//! they run in and see (`login_limits`, `node_cgroup`, `cgroup_view`), and what a
//! stopped agent left of its clusters on a host (`leftovers`).
//!
//! It knows no store and no agent: the control plane's `slurm_clusters` decides what each
//! node of a cluster runs (its slurmd, and on the head node the controller and the login)
//! and renders the shared configuration with these; the node agent's `slurm` modules run
//! the daemons with them, on the cluster's own nodes.

pub mod account;
mod cgroup_view;
pub mod conf;
pub mod daemon;
pub mod ext4_image;
pub mod home_fs;
pub mod host_lock;
pub mod job_tmp;
pub mod leftovers;
pub mod login;
pub mod login_limits;
mod mount;
pub mod munge;
pub mod node_cgroup;
pub mod ports;
pub mod sandbox;
pub mod status;
mod volume_view;

pub use ports::PortRange;

/// The programs a Slurm cluster needs on this host: the daemons, the controller's tools,
/// the account tools, the login's sshd and what makes the jobs' `/tmp` space.
pub const PROGRAMS: &[&str] = &[
    "slurmctld",
    "slurmd",
    "munged",
    "sinfo",
    "scontrol",
    "useradd",
    "sshd",
    "ssh-keygen",
    // The file systems of each node's jobs' /tmp (`job_tmp`) and of homes (`home_fs`).
    "mkfs.ext4",
    "mount",
];

/// Where programs are looked for: PATH, and /usr/sbin and /sbin (where Debian puts the
/// daemons, often not on a user's PATH).
fn search_dirs() -> Vec<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .collect()
}

/// The programs of [`PROGRAMS`] found in none of `dirs`.
fn missing_from(dirs: &[std::path::PathBuf]) -> Vec<&'static str> {
    PROGRAMS
        .iter()
        .copied()
        .filter(|p| !dirs.iter().any(|d| d.join(p).is_file()))
        .collect()
}

/// The programs missing on this host; empty when Slurm and munge are installed.
pub fn missing() -> Vec<&'static str> {
    missing_from(&search_dirs())
}

/// A Unix socket's path has at most this many bytes (108 with its NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// What slurmstepd appends to its node's spool for a job step's socket, at its longest:
/// `/<node>_<job id>.<step id>`, ids of up to 10 digits (a batch step is 4294967291).
const STEP_SOCKET_SUFFIX: usize = "/_4294967295.4294967295".len();

/// Refuses a Unix socket path that would be too long, naming what it is for.
pub fn check_socket_path(what: &str, path: &std::path::Path) -> Result<(), String> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(format!(
            "{what}: the Unix socket path {} would be {len} bytes, more than the {MAX_SOCKET_PATH} a socket path may have",
            path.display()
        ));
    }
    Ok(())
}

/// Refuses a node whose job steps' sockets (`<spool>/<node>_<job>.<step>`, made by
/// slurmstepd) would not fit a socket path: every batch job would fail to launch and be
/// held.
pub fn check_step_sockets(spool: &std::path::Path, node: &str) -> Result<(), String> {
    let len = spool.as_os_str().len() + node.len() + STEP_SOCKET_SUFFIX;
    if len > MAX_SOCKET_PATH {
        return Err(format!(
            "node {node}: its job steps' sockets in {} would be up to {len} bytes, more than the {MAX_SOCKET_PATH} a socket path may have; give the node a name of at most {} characters",
            spool.display(),
            MAX_SOCKET_PATH.saturating_sub(spool.as_os_str().len() + STEP_SOCKET_SUFFIX)
        ));
    }
    Ok(())
}

/// The Slurm cluster name of a tenant cluster: short (it names sockets and directories,
/// whose paths are bounded) and unique (from the cluster's id).
pub fn cluster_name(cluster_id: &str) -> String {
    let hex: String = cluster_id
        .chars()
        .filter(|c| c.is_ascii_hexdigit())
        .take(12)
        .collect::<String>()
        .to_ascii_lowercase();
    format!("gf{hex}")
}

/// The cgroup v1 controllers a node's Slurm daemons need: `proctrack/cgroup` (freezer),
/// `task/cgroup` (cpuset, memory, devices) and the logins' limits (memory, pids, cpu).
pub const CGROUP_CONTROLLERS: [&str; 6] = ["cpu", "cpuset", "devices", "freezer", "memory", "pids"];

/// Where the cgroup v1 hierarchies are mounted, one per controller.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Those of [`CGROUP_CONTROLLERS`] this host has not mounted as cgroup v1 hierarchies
/// under `/sys/fs/cgroup` (a host booted with the unified, v2-only hierarchy has none).
pub fn missing_cgroup_controllers() -> Vec<&'static str> {
    missing_cgroup_controllers_under(std::path::Path::new(CGROUP_ROOT))
}

/// Those of [`CGROUP_CONTROLLERS`] not mounted as cgroup v1 hierarchies under `root`.
pub fn missing_cgroup_controllers_under(root: &std::path::Path) -> Vec<&'static str> {
    CGROUP_CONTROLLERS
        .into_iter()
        .filter(|c| !root.join(c).join("cgroup.procs").exists())
        .collect()
}

/// Why Slurm cannot run on a host with `root` as its cgroup root, naming every missing
/// controller and where it should be; None when none is missing.
pub fn cgroup_controllers_problem(root: &std::path::Path) -> Option<String> {
    let missing = missing_cgroup_controllers_under(root);
    if missing.is_empty() {
        return None;
    }
    let named: Vec<String> = missing
        .iter()
        .map(|c| format!("'{c}' is not mounted at {}", root.join(c).display()))
        .collect();
    Some(format!(
        "cgroup v1 controller {} (Slurm's task/cgroup and proctrack/cgroup need {}; a v2-only host must boot with systemd.unified_cgroup_hierarchy=0)",
        named.join(", "),
        CGROUP_CONTROLLERS.join(", ")
    ))
}

/// Makes the cgroup `dir` (`<hierarchy>/<name>`; kept if it exists), mode 0755 whatever
/// the umask (the agent's is 0077): everyone may read and pass it (a team reads the
/// limits it meets). Fails with `unmounted(hierarchy)` when its cgroup v1 hierarchy is
/// not mounted. The login's and the node's cgroups are made with it.
pub(crate) fn make_cgroup(
    dir: &std::path::Path,
    unmounted: impl FnOnce(&std::path::Path) -> String,
) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let hierarchy = dir.parent().unwrap_or(dir);
    if !hierarchy.join("cgroup.procs").exists() {
        return Err(unmounted(hierarchy));
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot make {}: {e}", dir.display())),
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("cannot set the mode of {}: {e}", dir.display()))
}

/// Whether TCP `port` is free on this host now, on every address (slurmctld and slurmd
/// listen on all of them).
pub fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("0.0.0.0", port)).is_ok()
}

/// Whether `name` is a cluster name this module could have made (a path component).
pub fn valid_cluster_name(name: &str) -> bool {
    (1..=40).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// The user the Slurm daemons run as: the process's own (root on a real node).
pub fn current_user() -> String {
    // SAFETY: getpwuid returns a pointer into static storage or null; read at once.
    unsafe {
        let pw = libc::getpwuid(libc::geteuid());
        if pw.is_null() || (*pw).pw_name.is_null() {
            return "root".into();
        }
        std::ffi::CStr::from_ptr((*pw).pw_name)
            .to_string_lossy()
            .into_owned()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn missing_programs_are_named_and_cluster_names_are_short_path_components() {
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(super::missing_from(&[empty.path().into()]), super::PROGRAMS);
        for p in super::PROGRAMS {
            std::fs::write(empty.path().join(p), "").unwrap();
        }
        assert!(super::missing_from(&[empty.path().into()]).is_empty());
        let name = super::cluster_name("79bb28b1-5b97-4c1e-9d7a-000000000000");
        assert_eq!(name, "gf79bb28b15b97");
        assert!(super::valid_cluster_name(&name));
        assert!(!super::valid_cluster_name("../etc"));
        assert!(!super::valid_cluster_name(""));
    }

    /// This machine (and CI) mount the cgroup v1 controllers, as a GPU host must.
    #[test]
    fn this_host_mounts_every_cgroup_controller_slurm_needs() {
        assert_eq!(
            super::missing_cgroup_controllers(),
            Vec::<&str>::new(),
            "cgroup v1 controllers missing under /sys/fs/cgroup"
        );
    }

    /// A host (a fake cgroup root) without some controllers is told which, and where.
    #[test]
    fn missing_cgroup_controllers_are_named_with_where_they_belong() {
        let root = tempfile::tempdir().unwrap();
        for c in super::CGROUP_CONTROLLERS {
            if !["freezer", "memory"].contains(&c) {
                std::fs::create_dir(root.path().join(c)).unwrap();
                std::fs::write(root.path().join(c).join("cgroup.procs"), "").unwrap();
            }
        }
        // A directory without a hierarchy mounted on it does not count.
        std::fs::create_dir(root.path().join("freezer")).unwrap();
        assert_eq!(
            super::missing_cgroup_controllers_under(root.path()),
            vec!["freezer", "memory"]
        );
        let why = super::cgroup_controllers_problem(root.path()).unwrap();
        let at = |c: &str| format!("'{c}' is not mounted at {}", root.path().join(c).display());
        assert!(
            why.starts_with(&format!(
                "cgroup v1 controller {}, {}",
                at("freezer"),
                at("memory")
            )),
            "{why}"
        );
        assert!(
            why.contains("need cpu, cpuset, devices, freezer, memory, pids"),
            "{why}"
        );
        assert!(!why.contains("'cpu'"), "{why}");
        for c in ["freezer", "memory"] {
            std::fs::create_dir_all(root.path().join(c)).unwrap();
            std::fs::write(root.path().join(c).join("cgroup.procs"), "").unwrap();
        }
        assert_eq!(super::cgroup_controllers_problem(root.path()), None);
    }

    #[test]
    fn socket_paths_that_would_not_fit_are_refused_naming_what_they_are_for() {
        let spool = std::path::Path::new("/run/gpufleet/gf79bb28b15b97/n0123abcd/spool");
        assert!(super::check_step_sockets(spool, &"n".repeat(40)).is_ok());
        let e = super::check_step_sockets(spool, &"n".repeat(41)).unwrap_err();
        assert!(e.contains("at most 40 characters"), "{e}");
        let long = std::path::PathBuf::from("/x".repeat(60)).join("munge.sock");
        let e = super::check_socket_path("munged", &long).unwrap_err();
        assert!(e.starts_with("munged: the Unix socket path /x/x"), "{e}");
        assert!(super::check_socket_path("munged", spool).is_ok());
    }
}
