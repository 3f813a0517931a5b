//! The configuration files of a Slurm tenant cluster, rendered from its nodes and MIG
//! layout: slurm.conf (one part shared by the controller, the nodes and the tenant's
//! clients, plus each side's own paths and munge socket), cgroup.conf and gres.conf.
//!
//! Every node's slurmd runs on its own port with `NodeHostname` its host, so several
//! nodes (simulated ones) can share one machine.
//!
//! The controller runs on one of the cluster's own nodes (its head), and, with a second
//! node and a state directory both can reach, a backup on another: `SlurmctldHost` twice,
//! each by the host name its slurmctld finds for itself, and Slurm's own failover (the
//! backup takes over when the primary has not answered for `SlurmctldTimeout` nor written
//! its heartbeat to the state directory for as long).
//!
//! Jobs are confined: their processes are tracked in cgroups (`proctrack/cgroup`), each
//! job's tasks are held to the cores, memory and GPU or MIG devices Slurm gave it
//! (`task/cgroup` with cgroup.conf's `Constrain*`), and each job has a private `/tmp`
//! and `/dev/shm` (`job_container/tmpfs`, job_container.conf, `PrologFlags=Contain`)
//! that go when it ends.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use gpufleet_gpu::hardware::GpuInfo;

/// Where the cluster's controllers listen, as the nodes and clients reach them.
#[derive(Clone, Debug, PartialEq)]
pub struct Controller {
    /// Slurm's ClusterName (lower case, short).
    pub cluster: String,
    /// SlurmctldPort, the same on every controller's host.
    pub port: u16,
    /// The primary first, then the backup if there is one.
    pub hosts: Vec<ControllerHost>,
}

/// One host a controller of the cluster runs on.
#[derive(Clone, Debug, PartialEq)]
pub struct ControllerHost {
    /// Its host name, as slurmctld finds it there (gethostname): how a controller tells
    /// whether it is the primary or the backup.
    pub hostname: String,
    /// Where slurmd and clients reach it.
    pub addr: String,
}

impl Controller {
    /// The primary's address (where the cluster is reached; empty without one).
    pub fn addr(&self) -> &str {
        self.hosts.first().map_or("", |h| h.addr.as_str())
    }
}

/// One node of the cluster as slurm.conf declares it.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: String,
    /// Host its slurmd runs on (NodeHostname).
    pub host: String,
    /// Where the controller reaches its slurmd (NodeAddr).
    pub addr: String,
    pub port: u16,
    pub cpus: u32,
    /// RealMemory in MiB; 0: not known (Slurm's default, 1).
    pub memory_mib: u64,
    /// e.g. "gpu:h100:8" or "gpu:3g.40gb:16".
    pub gres: String,
    /// Its GPUs are simulated, and so may be its CPUs and memory: slurmd reports the
    /// declared values instead of what it finds.
    pub simulated: bool,
}

/// The memory a job gets per CPU it is given when it asks for none: the smallest node's
/// share, so that a node's every CPU can be given (at least 1 MiB).
pub fn def_mem_per_cpu(nodes: &[Node]) -> u64 {
    nodes
        .iter()
        .map(|n| n.memory_mib.max(1) / u64::from(n.cpus.max(1)))
        .min()
        .unwrap_or(1)
        .max(1)
}

/// The GRES type of a whole GPU of `model`: the lower-case family, e.g. "H100-80GB" ->
/// "h100", "L40S" -> "l40s".
pub fn gpu_type(model: &str) -> String {
    model
        .split('-')
        .next()
        .unwrap_or(model)
        .to_ascii_lowercase()
}

/// A node's GRES from the cluster's layout: whole GPUs, or every GPU's MIG slices.
pub fn node_gres(model: &str, gpus: u32, layout: &BTreeMap<String, u32>) -> String {
    if layout.is_empty() {
        return format!("gpu:{}:{gpus}", gpu_type(model));
    }
    layout
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(profile, n)| format!("gpu:{profile}:{}", u64::from(*n) * u64::from(gpus)))
        .collect::<Vec<_>>()
        .join(",")
}

/// The GRES the GPUs of a node have now (what its gres.conf declares), in the same form.
pub fn gres_of(gpus: &[GpuInfo]) -> String {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for g in gpus {
        if g.mig_enabled {
            for i in &g.instances {
                *counts.entry(i.profile.clone()).or_default() += 1;
            }
        } else {
            *counts.entry(gpu_type(&g.model)).or_default() += 1;
        }
    }
    counts
        .iter()
        .map(|(t, n)| format!("gpu:{t}:{n}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The slurm.conf every party shares: no AuthInfo (each side names its own munged socket)
/// and no daemon paths. It is what a tenant's client needs.
pub fn shared(ctl: &Controller, nodes: &[Node], slurm_user: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Slurm tenant cluster {}, managed by gpufleet.",
        ctl.cluster
    );
    let _ = writeln!(s, "ClusterName={}", ctl.cluster);
    // A controller looks for its own host name among the SlurmctldHost lines (the first
    // is the primary): one alone may be "localhost", which names any host; a primary and
    // a backup are named by their hosts. The address in parentheses is where everyone
    // else reaches them.
    match ctl.hosts.as_slice() {
        [only] => {
            let _ = writeln!(s, "SlurmctldHost=localhost({})", only.addr);
        }
        hosts => {
            for h in hosts {
                let _ = writeln!(s, "SlurmctldHost={}({})", h.hostname, h.addr);
            }
        }
    }
    let _ = writeln!(s, "SlurmctldPort={}", ctl.port);
    for line in [
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "ProctrackType=proctrack/cgroup",
        "TaskPlugin=task/cgroup",
        // A private /tmp and /dev/shm per job (job_container.conf), made at allocation.
        "JobContainerType=job_container/tmpfs",
        "PrologFlags=Contain",
        "SelectType=select/cons_tres",
        // CPUs and memory are consumed per job, so jobs on different GRES share a node.
        "SelectTypeParameters=CR_Core_Memory",
        "GresTypes=gpu",
        "ReturnToService=2",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        // How long a backup controller waits for the primary before it takes over.
        "SlurmctldTimeout=10",
        // Short: the controller pings its nodes every third of it, which is how it learns
        // of nodes again after a restart.
        "SlurmdTimeout=10",
        // Each side adds its own paths and munge socket to this file.
        "DebugFlags=NO_CONF_HASH",
        // A team works as its cluster's own account; nothing runs as root.
        "DisableRootJobs=YES",
    ] {
        let _ = writeln!(s, "{line}");
    }
    let _ = writeln!(s, "SlurmUser={slurm_user}");
    let _ = writeln!(s, "SlurmdUser={slurm_user}");
    if nodes.iter().any(|n| n.simulated) {
        // slurmd (and the controller's check of what it registers) take the declared CPUs
        // and memory of simulated nodes, not the simulating machine's.
        let _ = writeln!(s, "SlurmdParameters=config_overrides");
    }
    for n in nodes {
        let memory = match n.memory_mib {
            0 => String::new(),
            m => format!(" RealMemory={m}"),
        };
        let _ = writeln!(
            s,
            "NodeName={} NodeHostname={} NodeAddr={} Port={} CPUs={}{memory} Gres={} State=UNKNOWN",
            n.name, n.host, n.addr, n.port, n.cpus, n.gres
        );
    }
    if !nodes.is_empty() {
        let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        let _ = writeln!(
            s,
            "PartitionName=gpu Nodes={} Default=YES MaxTime=INFINITE State=UP DefMemPerCPU={}",
            names.join(","),
            def_mem_per_cpu(nodes)
        );
    }
    s
}

/// Slurm's own default lifetime of a job step credential, in seconds (AuthInfo
/// `cred_expire`), which is also how long a requeued job waits before it may start again.
pub const DEFAULT_CRED_EXPIRE_SECS: u32 = 120;

/// The shortest credential lifetime a node agent sets: a step's launch (its prolog, the
/// job's container, the user's environment) must fit in it.
pub const MIN_CRED_EXPIRE_SECS: u32 = 10;
/// The longest: an hour of a requeued job held back is past any use.
pub const MAX_CRED_EXPIRE_SECS: u32 = 3600;

/// The line that points a Slurm command or daemon at its munged, with the credential
/// lifetime when it is not Slurm's default (left unsaid then, so that the configuration,
/// and the daemons an agent of an earlier release started with it, stay as they were).
pub fn auth_info(socket: &Path, cred_expire: u32) -> String {
    match cred_expire {
        DEFAULT_CRED_EXPIRE_SECS => format!("AuthInfo=socket={}\n", socket.display()),
        secs => format!("AuthInfo=socket={},cred_expire={secs}\n", socket.display()),
    }
}

/// The controller's own lines: its munged, its state directory (`StateSaveLocation`,
/// shared with the other controller of the cluster when there is one), its pid and log in
/// its private `dir`, and the first job id it gives (see `MAX_FIRST_JOB_ID`; 0: Slurm's).
/// `cred_expire`: see [`auth_info`].
pub fn controller_lines(
    dir: &Path,
    state: &Path,
    socket: &Path,
    cred_expire: u32,
    first_job_id: u64,
) -> String {
    let first = match first_job_id {
        0 | 1 => String::new(),
        n => format!("FirstJobId={n}\n"),
    };
    format!(
        "{}StateSaveLocation={}\nSlurmctldPidFile={}\nSlurmctldLogFile={}\n{first}",
        auth_info(socket, cred_expire),
        state.display(),
        dir.join("slurmctld.pid").display(),
        dir.join("slurmctld.log").display(),
    )
}

/// The greatest FirstJobId a controller is given: well below Slurm's MaxJobId
/// (67,043,328), past which ids wrap around to FirstJobId.
pub const MAX_FIRST_JOB_ID: u64 = 60_000_000;

/// The port of the controllers in a rendered slurm.conf.
pub fn controller_port(conf: &str) -> Option<u16> {
    conf.lines()
        .find_map(|l| l.strip_prefix("SlurmctldPort="))
        .and_then(|p| p.trim().parse().ok())
}

/// A node's own lines: its spool (which the cluster's account must reach: its batch
/// scripts are there), and its pid and log in its private `dir`. `cred_expire`: see
/// [`auth_info`].
pub fn slurmd_lines(spool: &Path, dir: &Path, socket: &Path, cred_expire: u32) -> String {
    format!(
        "{}SlurmdSpoolDir={}\nSlurmdPidFile={}\nSlurmdLogFile={}\n",
        auth_info(socket, cred_expire),
        spool.display(),
        dir.join("slurmd.pid").display(),
        dir.join("slurmd.log").display(),
    )
}

/// cgroup.conf as the control plane gives it to every node: every job confined to its
/// cores, memory (no swap) and GRES devices. A node may hold its cores unconfined (see
/// [`node_cgroup`]).
pub fn cgroup() -> String {
    node_cgroup(true)
}

/// cgroup.conf of a node: cgroup v1 (what Debian's Slurm 22.05 and these hosts mount),
/// memory limited to what the job was given with no swap beyond it, only the job's own
/// GPU or MIG devices openable, and, with `constrain_cores`, only its own cores. A
/// simulated node that declares more CPUs than its host has cannot pin a job to CPUs the
/// host lacks: it keeps cores unconfined (and says so in its log).
pub fn node_cgroup(constrain_cores: bool) -> String {
    let cores = if constrain_cores { "yes" } else { "no" };
    format!(
        "CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\nConstrainCores={cores}\n\
         ConstrainRAMSpace=yes\nAllowedRAMSpace=100\nConstrainSwapSpace=yes\n\
         AllowedSwapSpace=0\nConstrainDevices=yes\n"
    )
}

/// job_container.conf of a node: each job's private `/tmp` and `/dev/shm` are made under
/// `base` (root's, private to the node), and removed when the job ends.
pub fn job_container(base: &Path) -> String {
    format!("AutoBasePath=true\nBasePath={}\n", base.display())
}

/// The CPUs `node` is declared with in a rendered slurm.conf.
pub fn node_cpus(conf: &str, node: &str) -> Option<u32> {
    conf.lines()
        .filter_map(|l| l.strip_prefix("NodeName="))
        .find(|rest| rest.split_whitespace().next() == Some(node))
        .and_then(|rest| {
            rest.split_whitespace()
                .find_map(|w| w.strip_prefix("CPUs="))
                .and_then(|c| c.parse().ok())
        })
}

/// One GRES device: its type and the character device that stands for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Device {
    pub gres_type: String,
    pub file: String,
}

/// gres.conf for `node`: one line per device; `AutoDetect=off` so that Slurm trusts these.
pub fn gres(node: &str, devices: &[Device]) -> String {
    let mut s = String::from("AutoDetect=off\n");
    for d in devices {
        let _ = writeln!(
            s,
            "NodeName={node} Name=gpu Type={} File={}",
            d.gres_type, d.file
        );
    }
    s
}

/// Reads back the `NodeName=` lines of a rendered slurm.conf: name -> port.
pub fn node_ports(conf: &str) -> BTreeMap<String, u16> {
    let mut out = BTreeMap::new();
    for line in conf.lines() {
        let Some(rest) = line.strip_prefix("NodeName=") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let Some(name) = words.next() else { continue };
        if let Some(port) = words
            .find_map(|w| w.strip_prefix("Port="))
            .and_then(|p| p.parse().ok())
        {
            out.insert(name.to_string(), port);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_controller_is_given_its_first_job_id_unless_slurms_default() {
        let (dir, state, sock) = (Path::new("/d"), Path::new("/s"), Path::new("/m.sock"));
        let lines = |first| controller_lines(dir, state, sock, DEFAULT_CRED_EXPIRE_SECS, first);
        assert!(!lines(0).contains("FirstJobId"));
        assert!(!lines(1).contains("FirstJobId"));
        assert!(lines(10_007).ends_with("FirstJobId=10007\n"));
    }

    #[test]
    fn the_credential_lifetime_is_said_only_when_it_is_not_slurms_default() {
        let (dir, sock) = (Path::new("/d"), Path::new("/m.sock"));
        // Slurm's default: the line an earlier release wrote, so its daemons are adopted.
        assert_eq!(
            auth_info(sock, DEFAULT_CRED_EXPIRE_SECS),
            "AuthInfo=socket=/m.sock\n"
        );
        assert_eq!(
            auth_info(sock, 15),
            "AuthInfo=socket=/m.sock,cred_expire=15\n"
        );
        // The controller (which delays requeued jobs by it) and slurmd say the same.
        assert!(controller_lines(dir, Path::new("/s"), sock, 15, 0)
            .starts_with("AuthInfo=socket=/m.sock,cred_expire=15\n"));
        assert!(slurmd_lines(Path::new("/spool"), dir, sock, 15)
            .starts_with("AuthInfo=socket=/m.sock,cred_expire=15\n"));
    }

    #[test]
    fn gres_names_whole_gpus_by_family_and_mig_slices_by_profile() {
        assert_eq!(gpu_type("H100-80GB"), "h100");
        assert_eq!(gpu_type("L40S"), "l40s");
        assert_eq!(node_gres("H100-80GB", 8, &BTreeMap::new()), "gpu:h100:8");
        let layout = BTreeMap::from([("3g.40gb".to_string(), 2), ("1g.10gb".to_string(), 1)]);
        assert_eq!(
            node_gres("H100-80GB", 8, &layout),
            "gpu:1g.10gb:8,gpu:3g.40gb:16"
        );
    }

    #[test]
    fn shared_conf_has_no_auth_info_and_names_every_node() {
        let ctl = Controller {
            cluster: "c1".into(),
            port: 7000,
            hosts: vec![ControllerHost {
                hostname: "gpu-a".into(),
                addr: "127.0.0.1".into(),
            }],
        };
        let node = |name: &str, port: u16, cpus: u32, memory_mib: u64| Node {
            name: name.into(),
            host: "gpu-host".into(),
            addr: "10.0.0.7".into(),
            port,
            cpus,
            memory_mib,
            gres: "gpu:h100:8".into(),
            simulated: false,
        };
        let mut nodes = vec![node("a", 7001, 96, 1_000_000), node("b", 7002, 64, 512_000)];
        let s = shared(&ctl, &nodes, "root");
        assert!(s.contains(
            "NodeName=a NodeHostname=gpu-host NodeAddr=10.0.0.7 Port=7001 CPUs=96 RealMemory=1000000 Gres=gpu:h100:8 State=UNKNOWN\n"
        ), "{s}");
        assert!(s.contains("SelectTypeParameters=CR_Core_Memory\n"));
        assert!(s.contains(" DefMemPerCPU=8000\n"), "{s}");
        assert!(!s.contains("config_overrides"));
        nodes[1].simulated = true;
        assert!(shared(&ctl, &nodes, "root").contains("SlurmdParameters=config_overrides\n"));
        assert!(!s.contains("AuthInfo"));
        assert!(s.contains("DisableRootJobs=YES\n"));
        for confined in [
            "TaskPlugin=task/cgroup\n",
            "ProctrackType=proctrack/cgroup\n",
            "JobContainerType=job_container/tmpfs\n",
            "PrologFlags=Contain\n",
        ] {
            assert!(s.contains(confined), "no {confined} in {s}");
        }
        assert_eq!(node_cpus(&s, "b"), Some(64));
        assert_eq!(node_cpus(&s, "c"), None);
        assert!(cgroup().contains("ConstrainCores=yes\n"));
        assert!(node_cgroup(false).contains("ConstrainCores=no\n"));
        for c in [
            "ConstrainRAMSpace=yes",
            "ConstrainDevices=yes",
            "AllowedSwapSpace=0",
        ] {
            assert!(cgroup().contains(c), "{c}");
        }
        assert!(s.contains("SlurmctldPort=7000\n"));
        assert_eq!(controller_port(&s), Some(7000));
        assert!(s.contains("SlurmctldHost=localhost(127.0.0.1)\n"), "{s}");
        // With a backup, each controller is named by its host, the primary first.
        let mut two = ctl.clone();
        two.hosts.push(ControllerHost {
            hostname: "gpu-b".into(),
            addr: "10.0.0.8".into(),
        });
        let s2 = shared(&two, &nodes, "root");
        let hosts: Vec<&str> = s2
            .lines()
            .filter(|l| l.starts_with("SlurmctldHost="))
            .collect();
        assert_eq!(
            hosts,
            [
                "SlurmctldHost=gpu-a(127.0.0.1)",
                "SlurmctldHost=gpu-b(10.0.0.8)"
            ]
        );
        assert!(s.contains("PartitionName=gpu Nodes=a,b "));
        assert_eq!(
            node_ports(&s),
            BTreeMap::from([("a".to_string(), 7001), ("b".to_string(), 7002)])
        );
    }
}
