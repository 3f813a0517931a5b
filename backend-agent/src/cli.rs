//! Command-line flags and their environment equivalents, and the settings of the crates
//! they become: clap's types live here only.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "gpufleet-agent",
    version,
    about = "The gpufleet control plane and node agent"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the control plane (gRPC API over the simulated or real fleet).
    Serve(Box<ServeArgs>),
    /// Show the GPU types of the fleet with pool, on-demand and free node counts (the same
    /// counts for every token).
    Fleet(ClientArgs),
    /// Show the nodes the token may see: every node with the admin token, the nodes of its
    /// own clusters with a tenant token.
    Nodes(ClientArgs),
    /// Print a read-only report of this host's GPUs (inventory, MIG mode, driver, health).
    HwCheck(HwCheckArgs),
    /// Run the node agent of this GPU host: register with the control plane, carry out its
    /// work orders on this host's GPUs.
    Node(Box<NodeArgs>),
    /// Print a node agent's own view of its node (from its data dir).
    NodeStatus(NodeStatusArgs),
    /// Return a quarantined node to service (admin): its agent resets it, then it is ready.
    NodeReturn(NodeReturnArgs),
    /// Release a node's name from the host that first registered it (admin), e.g. a host
    /// rebuilt without its agent's data dir: the next registration takes the name.
    NodeForgetSecret(NodeReturnArgs),
    /// Show what happened to a tenant cluster, a node or a breaker (its event log), or to
    /// the whole fleet (the admin, without an object), oldest first.
    Events(EventsArgs),
    /// List the tenants the token may see (a tenant token: its own), with their ids.
    Tenants(ClientArgs),
    /// List the tenant clusters the token may see, with their ids (`--tenant`: one
    /// tenant's, by name or id).
    Clusters(ListArgs),
    /// List the reservations the token may see, with their ids (`--tenant`: one tenant's).
    Reservations(ListArgs),
    /// A tenant's bearer tokens (or, with the admin token and no --tenant, the admin's):
    /// list, create a named read or write token, rotate with an overlap, revoke.
    #[command(subcommand)]
    Token(TokenCommand),
    /// GPU-seconds held in a window, per tenant, cluster, GPU model and capacity class
    /// (the admin: every team's, or one with --tenant; a tenant token: its own).
    Usage(UsageArgs),
    /// The audit log: every change and every refused call, oldest first (the admin: all,
    /// or one tenant's with --tenant; a tenant token: its own). With --verify: walk the
    /// log's hash chains in <data-dir>/state.db and exit 1 naming the first broken entry.
    Audit(AuditArgs),
    /// The automatic-quarantine breakers (admin): list them, or reset one.
    #[command(subcommand)]
    Breaker(BreakerCommand),
    /// Create a small CA and issue the control plane's and the node agents' certificates
    /// for mutual TLS.
    Pki(PkiArgs),
    /// Verify the state database's invariants, read-only (also while serve runs): no
    /// instant overbooked, no quota exceeded, no node in two clusters, gap-free tenant
    /// sequences, usage records that count exactly the GPUs held, and with --answers every
    /// acknowledged answer held. Exits 1 naming each violation.
    Check(CheckArgs),
    /// Copy the control plane's SQLite store into an empty PostgreSQL database (the
    /// store's second engine), in one transaction, and check the copy. serve must be
    /// stopped. The database's address (postgres://user:password@host:port/db) comes
    /// from GPUFLEET_DATABASE_URL or --database-file, never from the command line.
    Migrate(MigrateArgs),
    /// Internal: one load test on the only GPU CUDA shows this process, one answer line
    /// printed. The node agent runs it for each MIG slice, with CUDA_VISIBLE_DEVICES set
    /// to the slice (CUDA reads it once per process).
    #[command(hide = true)]
    LoadProbe(LoadProbeArgs),
    /// Replay a demand trace through the control plane's admission on a simulated clock,
    /// pooled and as fixed per-team partitions, and print what pooling buys
    /// (docs/guides/replay.md).
    Replay(ReplayArgs),
    /// Print a seeded synthetic demand trace for a replay's fleet description (simple CSV).
    ReplaySynthetic(ReplaySyntheticArgs),
}

/// Where the control plane's nodes come from.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeAgents {
    /// The fleet (fleet file, or this host with --hardware nvml) runs as in-process agents
    /// that speak the same protocol over loopback.
    Embedded,
    /// The fleet is whoever registers with the join token (`gpufleet-agent node`).
    External,
}

/// Which kind of capacity a node is.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapacityKind {
    Pool,
    OnDemand,
}

impl CapacityKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CapacityKind::Pool => "pool",
            CapacityKind::OnDemand => "on-demand",
        }
    }
}

/// A duration such as `30s`, `5m`, `1h` or `250ms`.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("'{text}': give a unit (ms, s, m or h), e.g. 30s"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("'{text}': expected a whole number and a unit, e.g. 30s"))?;
    let ms = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => {
            return Err(format!(
                "'{text}': unknown unit '{unit}' (use ms, s, m or h)"
            ))
        }
    }
    .filter(|&ms| ms > 0 && ms <= 7 * 24 * 3_600_000)
    .ok_or_else(|| format!("'{text}': must be more than 0 and at most 7 days"))?;
    Ok(std::time::Duration::from_millis(ms))
}

/// `--audit-keep`: whole days or hours (`90d`, `36h`), from 1h to 3650d.
pub fn parse_retention(text: &str) -> Result<std::time::Duration, String> {
    let t = text.trim();
    let (number, hours) = match t.strip_suffix('d') {
        Some(n) => (n, 24),
        None => (
            t.strip_suffix('h')
                .ok_or_else(|| format!("'{t}': give days or hours, e.g. 90d or 36h"))?,
            1,
        ),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("'{t}': expected a whole number and d or h, e.g. 90d"))?;
    let secs = n.saturating_mul(hours * 3600);
    if !(3600..=3650 * 24 * 3600).contains(&secs) {
        return Err(format!("'{t}': must be at least 1h and at most 3650d"));
    }
    Ok(std::time::Duration::from_secs(secs))
}

/// `--health-interval`: a duration, or 0 to turn periodic checks off.
pub fn parse_interval(text: &str) -> Result<std::time::Duration, String> {
    if text.trim() == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    parse_duration(text)
}

/// `token rotate --overlap`: a duration, or none at all (`0`, `0s`: the old secret is
/// refused at once).
pub fn parse_overlap(text: &str) -> Result<std::time::Duration, String> {
    let digits = text
        .trim()
        .trim_end_matches(|c: char| c.is_ascii_alphabetic());
    if !digits.is_empty() && digits.chars().all(|c| c == '0') {
        return Ok(std::time::Duration::ZERO);
    }
    parse_duration(text)
}

/// A duration of at least one second: a connection's time limits (shorter ones would close
/// clients that are only slow to connect).
pub fn parse_connection_time(text: &str) -> Result<std::time::Duration, String> {
    let d = parse_duration(text)?;
    if d < std::time::Duration::from_secs(1) {
        return Err(format!("'{}': at least 1s", text.trim()));
    }
    Ok(d)
}

#[derive(Args, Debug)]
pub struct NodeArgs {
    /// The control plane's URL (https:// for TLS); several addresses of the same control
    /// plane comma-separated or the flag repeated (at most 8, one scheme): the agent
    /// connects to the first and, when a connection fails or drops, moves to the next.
    #[arg(
        long,
        env = "GPUFLEET_CONTROL_PLANE",
        value_name = "URL[,URL...]",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7700"
    )]
    pub control_plane: Vec<String>,
    /// The control plane's join token (its <data-dir>/join.token).
    #[arg(
        long,
        env = "GPUFLEET_JOIN_TOKEN",
        hide_env_values = true,
        default_value = ""
    )]
    pub join_token: String,
    /// A file holding the join token (0600; e.g. a copy of the control plane's
    /// join.token), read at every connection: after `token rotate join` write the new one
    /// here within the overlap, and the agent uses it at its next session, no restart.
    /// Instead of GPUFLEET_JOIN_TOKEN.
    #[arg(long, env = "GPUFLEET_JOIN_TOKEN_FILE", value_name = "FILE")]
    pub join_token_file: Option<PathBuf>,
    /// This node's name (a DNS label); default: the host name's first label, lower case.
    #[arg(long, env = "GPUFLEET_NODE_NAME")]
    pub name: Option<String>,
    /// Directory for the agent's order journal and status (and simulated GPUs).
    #[arg(
        long,
        env = "GPUFLEET_NODE_DATA_DIR",
        default_value = "./.gpufleet-node"
    )]
    pub data_dir: PathBuf,
    /// GPU backend: simulated GPUs, or this host's GPUs through NVML.
    #[arg(long, env = "GPUFLEET_HARDWARE", value_enum, default_value = "sim")]
    pub hardware: Hardware,
    /// With --hardware nvml: the NVML library to load instead of the system's
    /// libnvidia-ml.so.1 (e.g. a test double).
    #[arg(long, env = "GPUFLEET_NVML_LIB", value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// Whether the node is owned pool capacity or on-demand capacity.
    #[arg(long, env = "GPUFLEET_CAPACITY", value_enum, default_value = "pool")]
    pub capacity: CapacityKind,
    /// With --hardware sim: the catalog model of the simulated GPUs.
    #[arg(long, env = "GPUFLEET_GPU_TYPE", default_value = "H100-80GB")]
    pub gpu_type: String,
    /// With --hardware sim: how many GPUs the node has.
    #[arg(long, env = "GPUFLEET_GPUS", default_value_t = 8)]
    pub gpus: u32,
    /// With --hardware sim: how long each simulated MIG change takes (models slow hardware).
    #[arg(long, env = "GPUFLEET_SIM_OP_DELAY_MS", default_value_t = 0)]
    pub sim_op_delay_ms: u64,
    /// With --hardware nvml: the command that installs a driver version (given as $1 and
    /// GPUFLEET_DRIVER_VERSION), e.g. a package manager or a driver-container switch. Without
    /// it, driver changes on this host are refused.
    #[arg(long, env = "GPUFLEET_DRIVER_INSTALL_CMD")]
    pub driver_install_cmd: Option<String>,
    /// Serve Prometheus metrics (this host's GPUs, the order queue) at http://ADDR/metrics
    /// (port 0 picks a free port; the address is logged). Off by default.
    #[arg(long, env = "GPUFLEET_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// PEM of the CA that signed the control plane's certificate (https control planes).
    #[arg(long, env = "GPUFLEET_CA_CERT", value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// This agent's certificate for mutual TLS (from `gpufleet-agent pki --agent NAME`).
    #[arg(long, env = "GPUFLEET_NODE_CERT", value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// The private key of --cert.
    #[arg(long, env = "GPUFLEET_NODE_KEY", value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Where this agent accepts bandwidth-test streams from its peers (port 0 picks a free
    /// port); reported to the control plane at registration. Default: this host's address
    /// on the route to the control plane (loopback when it is on this host), a free port.
    #[arg(long, env = "GPUFLEET_BANDWIDTH_LISTEN", value_name = "ADDR")]
    pub bandwidth_listen: Option<SocketAddr>,
    /// The host:port peers reach the bandwidth listener at, when it differs from the bound
    /// address (e.g. when listening on 0.0.0.0).
    #[arg(long, env = "GPUFLEET_BANDWIDTH_ADVERTISE", value_name = "HOST:PORT")]
    pub bandwidth_advertise: Option<String>,
    /// How often the agent pings the control plane over its connection (HTTP/2
    /// keepalive); one unanswered for as long ends the connection (a partition) and the
    /// agent reconnects.
    #[arg(long, env = "GPUFLEET_KEEPALIVE", default_value = "10s", value_parser = parse_duration)]
    pub keepalive: std::time::Duration,
    /// This host's IPv4 address the Slurm controller reaches its slurmd at (NodeAddr);
    /// default: the host of --bandwidth-advertise or --bandwidth-listen when it names one,
    /// else this host's address on the route to the control plane.
    #[arg(long, env = "GPUFLEET_NODE_ADDRESS", value_name = "ADDR")]
    pub address: Option<std::net::Ipv4Addr>,
    /// With --hardware sim: the CPUs the node declares to Slurm (default: the host's).
    #[arg(long, env = "GPUFLEET_NODE_CPUS", value_name = "N")]
    pub cpus: Option<u32>,
    /// With --hardware sim: the memory in MiB the node declares to Slurm (default: the
    /// host's).
    #[arg(long, env = "GPUFLEET_NODE_MEMORY_MIB", value_name = "MIB")]
    pub memory_mib: Option<u64>,
    /// Where this host mounts the platform's shared storage (the same path as the control
    /// plane's --shared-storage): the volumes of this node's cluster are bind-mounted from
    /// it at their storage_path under /run/gpufleet/volumes. Without it this node mounts
    /// no team volume.
    #[arg(long, env = "GPUFLEET_SHARED_STORAGE", value_name = "DIR")]
    pub shared_storage: Option<PathBuf>,
    /// Memory (swap included) a Slurm login on this node may use, all its sessions
    /// together, in MiB; past it the kernel kills a process of the login's, never another.
    #[arg(long, env = "GPUFLEET_LOGIN_MEMORY_MIB", value_name = "MIB", default_value_t = 8192, value_parser = clap::value_parser!(u64).range(64..=16_777_216))]
    pub login_memory_mib: u64,
    /// CPUs' worth of time a Slurm login on this node may use, all its sessions together
    /// [default: a quarter of this host's CPUs, at least 1 and at most 4].
    #[arg(long, env = "GPUFLEET_LOGIN_CPUS", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub login_cpus: Option<u32>,
    /// Processes and threads a Slurm login on this node may run at once, all its
    /// sessions together (a fork bomb stops there).
    #[arg(long, env = "GPUFLEET_LOGIN_PIDS", value_name = "N", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(16..=4_194_304))]
    pub login_pids: u32,
    /// Disk space each Slurm cluster's jobs on this node may fill in their /tmp, all its
    /// jobs together, in MiB: a file system of its own (a sparse file in the data dir);
    /// past it a job's write fails with "No space left on device", and nothing else fills.
    #[arg(long, env = "GPUFLEET_JOB_TMP_MIB", value_name = "MIB", default_value_t = gpufleet_slurm::job_tmp::DEFAULT_MIB, value_parser = clap::value_parser!(u64).range(gpufleet_slurm::job_tmp::MIN_MIB..=gpufleet_slurm::job_tmp::MAX_MIB))]
    pub job_tmp_mib: u64,
    /// Disk space each Slurm cluster's home on this host may hold, in MiB, where the
    /// cluster has no team volume to be its home: a file system of its own (a sparse file
    /// in the data dir), shared by the cluster's nodes and login on this host and kept
    /// until its last node leaves; past it a write fails with "No space left on device".
    /// Applies to homes made from then on.
    #[arg(long, env = "GPUFLEET_HOME_MIB", value_name = "MIB", default_value_t = gpufleet_slurm::home_fs::DEFAULT_MIB, value_parser = clap::value_parser!(u64).range(gpufleet_slurm::home_fs::MIN_MIB..=gpufleet_slurm::home_fs::MAX_MIB))]
    pub home_mib: u64,
    /// Seconds a Slurm job step's credential lives on this node's daemons (Slurm's
    /// AuthInfo cred_expire), which is also how long a requeued job waits before it may
    /// start again: after its node was lost, the controller on this node holds it back
    /// this long plus 1 s. A step's launch must fit in it. Give every node agent the same.
    #[arg(long, env = "GPUFLEET_SLURM_CRED_EXPIRE", value_name = "SECONDS", default_value_t = gpufleet_slurm::conf::DEFAULT_CRED_EXPIRE_SECS, value_parser = clap::value_parser!(u32).range(gpufleet_slurm::conf::MIN_CRED_EXPIRE_SECS as i64..=gpufleet_slurm::conf::MAX_CRED_EXPIRE_SECS as i64))]
    pub slurm_cred_expire: u32,
    /// End this node's Slurm daemons, its teams' jobs and login sessions when the agent
    /// stops. Without it they run on through a restart, crash or upgrade of the agent,
    /// and the next agent adopts them.
    #[arg(long, env = "GPUFLEET_STOP_WORKLOADS")]
    pub stop_workloads: bool,
    /// Do not serve: end and remove everything of every Slurm cluster this node's agent
    /// kept on this host (daemons, jobs, accounts, keys) and its node-local team volumes
    /// (unmounted, data deleted), then exit. Refused while an agent runs on the data dir.
    #[arg(long)]
    pub clean: bool,
}

#[derive(Args, Debug)]
pub struct EventsArgs {
    /// The object: a cluster's id, a node's name or breaker/<MODEL> (admin). Without one,
    /// every event the token may see, oldest first: the admin's is the whole fleet's.
    pub object_id: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Args, Debug)]
pub struct UsageArgs {
    /// The window's start, RFC 3339 (e.g. 2027-01-01T00:00:00Z).
    #[arg(long)]
    pub since: String,
    /// The window's end (exclusive), RFC 3339; held time counts up to now at most.
    #[arg(long)]
    pub until: String,
    /// Group by any of tenant, cluster, gpu_type, class, mig_profile (comma-separated);
    /// none: one total.
    #[arg(long, value_delimiter = ',')]
    pub by: Vec<String>,
    /// table (the grouped columns), json, or csv (every column, always in the same order).
    #[arg(long, value_enum, default_value_t = UsageFormat::Table)]
    pub format: UsageFormat,
    /// Price the rows: the price list `replay --prices` reads (CSV
    /// `gpu_type,class,per_gpu_hour`; `borrowed-preemptible` is priced as `burst`). Each row
    /// gains its cost, with totals per tenant; needs --by to include gpu_type and class; a
    /// row without a price is refused.
    #[arg(long, value_name = "PRICES")]
    pub prices: Option<PathBuf>,
    #[command(flatten)]
    pub list: ListArgs,
}

/// How `usage` prints.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageFormat {
    Table,
    Json,
    Csv,
}

/// The flags of a list command.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// Only this tenant's, by name or id.
    #[arg(long)]
    pub tenant: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `gpufleet-agent token ...`. A new secret is printed alone on stdout (redirect it to a
/// file); what it is goes to stderr.
#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// The tokens, live and refused (with why), never their secrets.
    List(ListArgs),
    /// Issue a named token.
    Create(TokenCreateArgs),
    /// A new secret for a token ("default": the tenant's own; "admin" without --tenant:
    /// the admin token, written to the data dir's admin.token; "join" without --tenant:
    /// the node agents' join token, written to join.token); the old one keeps working
    /// for the overlap.
    Rotate(TokenRotateArgs),
    /// Refuse a token at once (every secret of that name).
    Revoke(TokenNameArgs),
}

#[derive(Args, Debug)]
pub struct TokenNameArgs {
    /// The token's name.
    pub name: String,
    /// The tenant (name or id); default: the token's own, or the admin's with the admin token.
    #[arg(long)]
    pub tenant: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Args, Debug)]
pub struct TokenCreateArgs {
    #[command(flatten)]
    pub token: TokenNameArgs,
    /// read (plan and read, never change) or write.
    #[arg(long)]
    pub scope: String,
    /// Refused after this long, e.g. 30m, 24h (default: never).
    #[arg(long, value_parser = parse_duration)]
    pub expires_in: Option<std::time::Duration>,
}

#[derive(Args, Debug)]
pub struct TokenRotateArgs {
    #[command(flatten)]
    pub token: TokenNameArgs,
    /// How long the old secret keeps working, e.g. 0s (refused at once), 10m, 24h (at
    /// most 7 days).
    #[arg(long, value_parser = parse_overlap, default_value = "1h")]
    pub overlap: std::time::Duration,
}

/// `gpufleet-agent breaker ...`.
#[derive(Subcommand, Debug)]
pub enum BreakerCommand {
    /// Show each GPU model's breaker: open or closed, why, automatic quarantines in the
    /// window and the cap.
    List(ClientArgs),
    /// Close a model's breaker (admin): failed checks quarantine its nodes again, counted
    /// afresh from now.
    Reset(BreakerResetArgs),
}

#[derive(Args, Debug)]
pub struct BreakerResetArgs {
    /// The GPU model whose breaker to close, e.g. H100-80GB.
    #[arg(long)]
    pub gpu_type: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Args, Debug)]
pub struct NodeReturnArgs {
    /// The node's name.
    pub name: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The control plane's data dir, whose state.db is checked.
    #[arg(long, env = "GPUFLEET_DATA_DIR", default_value = "./.gpufleet")]
    pub data_dir: PathBuf,
    /// The state database itself, instead of <data-dir>/state.db (e.g. a backup).
    #[arg(long, value_name = "FILE")]
    pub store: Option<PathBuf>,
    /// A log of acknowledged answers (JSON lines: request_id, op create|resize|delete,
    /// kind reservation|cluster, object with id and the fields answered) to hold the
    /// store to.
    #[arg(long, value_name = "FILE")]
    pub answers: Option<PathBuf>,
    /// serve's test clock (see serve --clock-file): the checks look from its time.
    #[arg(long, env = "GPUFLEET_CLOCK_FILE", value_name = "PATH", hide = true)]
    pub clock_file: Option<PathBuf>,
    /// Check the store on PostgreSQL whose address is in GPUFLEET_DATABASE_URL (or
    /// --database-file) instead of an SQLite file (e.g. after `gpufleet-agent migrate`).
    #[arg(long, conflicts_with = "store")]
    pub postgres: bool,
    /// A file (0600) holding the PostgreSQL store's address, with --postgres.
    #[arg(long, value_name = "FILE", requires = "postgres")]
    pub database_file: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct MigrateArgs {
    /// The control plane's data dir, whose state.db is copied (its lock is taken: serve
    /// must be stopped).
    #[arg(long, env = "GPUFLEET_DATA_DIR", default_value = "./.gpufleet")]
    pub data_dir: PathBuf,
    /// A file (0600) holding the address of the PostgreSQL database to copy into,
    /// instead of GPUFLEET_DATABASE_URL.
    #[arg(long, value_name = "FILE")]
    pub database_file: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct AuditArgs {
    /// Verify the log's hash chains in the data dir's state.db (read-only, also while
    /// serve runs) instead of listing entries: exits 1 naming the first edited or deleted
    /// entry, else prints each chain's newest hash (keep those elsewhere: a rewrite of a
    /// whole chain shows only against them).
    #[arg(long)]
    pub verify: bool,
    #[command(flatten)]
    pub list: ListArgs,
}

#[derive(Args, Debug)]
pub struct NodeStatusArgs {
    /// The node agent's data dir.
    #[arg(
        long,
        env = "GPUFLEET_NODE_DATA_DIR",
        default_value = "./.gpufleet-node"
    )]
    pub data_dir: PathBuf,
}

/// How durable a commit is before its caller is answered (serve's `--durability`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// SQLite synchronous=FULL: each commit is fsynced; it survives an OS crash.
    Full,
    /// SQLite synchronous=NORMAL: a commit survives the process dying, but an OS crash or
    /// power loss may lose the last acknowledged ones.
    Normal,
}

/// Which GPU backend the agent drives.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hardware {
    /// Simulated nodes that enforce the MIG rules like the hardware does.
    Sim,
    /// This host's NVIDIA GPUs through NVML as the fleet's one node (needs the driver).
    Nvml,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port; the real one is printed).
    #[arg(long, env = "GPUFLEET_LISTEN", default_value = "127.0.0.1:7700")]
    pub listen: SocketAddr,
    /// With embedded node agents: this host's address where teams reach its clusters'
    /// Slurm logins (an IPv4 address); default: the --listen address when it is not
    /// 0.0.0.0, else 127.0.0.1. Not used with external node agents (their clusters'
    /// controllers and logins run on the nodes, at the addresses the agents declare).
    #[arg(long, env = "GPUFLEET_ADVERTISE_ADDRESS", value_name = "ADDR", value_parser = parse_advertise_address)]
    pub advertise_address: Option<std::net::IpAddr>,
    /// Directory holding the state database, the admin token and the volumes.
    #[arg(long, env = "GPUFLEET_DATA_DIR", default_value = "./.gpufleet")]
    pub data_dir: PathBuf,
    /// The platform's shared storage: a btrfs file system every host mounts at this path.
    /// Each tenant cluster's volume is a subvolume there with a quota of exactly its
    /// storage_gib. Without it, volumes are unsized directories in the data dir.
    #[arg(long, env = "GPUFLEET_SHARED_STORAGE", value_name = "DIR")]
    pub shared_storage: Option<PathBuf>,
    /// With embedded node agents: end their Slurm daemons, the teams' jobs and login
    /// sessions when serve stops. Without it they run on through a restart or upgrade of
    /// serve, and the embedded agents of the next serve adopt them.
    #[arg(long, env = "GPUFLEET_STOP_WORKLOADS")]
    pub stop_workloads: bool,
    /// Fleet file (TOML with [[pool]] and [[on_demand]] tables); built-in default when absent.
    /// Only with --hardware sim.
    #[arg(long, env = "GPUFLEET_FLEET")]
    pub fleet: Option<PathBuf>,
    /// Admin bearer token; when absent one is generated into <data-dir>/admin.token.
    #[arg(long, env = "GPUFLEET_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// GPU backend.
    #[arg(long, env = "GPUFLEET_HARDWARE", value_enum, default_value = "sim")]
    pub hardware: Hardware,
    /// With --hardware nvml: the NVML library to load instead of the system's
    /// libnvidia-ml.so.1 (e.g. a test double).
    #[arg(long, env = "GPUFLEET_NVML_LIB", value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// PEM certificate (chain) to serve the API over TLS; needs --tls-key.
    #[arg(long, env = "GPUFLEET_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert; needs --tls-cert.
    #[arg(long, env = "GPUFLEET_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Where nodes come from: in-process agents for the fleet, or external node agents.
    #[arg(
        long,
        env = "GPUFLEET_NODE_AGENTS",
        value_enum,
        default_value = "embedded"
    )]
    pub node_agents: NodeAgents,
    /// Token node agents present to join; when absent one is generated into
    /// <data-dir>/join.token.
    #[arg(long, env = "GPUFLEET_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    /// A node without heartbeats this long is unreachable and its cluster degraded.
    #[arg(long, env = "GPUFLEET_NODE_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub node_timeout: std::time::Duration,
    /// An unreachable node still in a cluster is replaced after this long.
    #[arg(long, env = "GPUFLEET_REPLACE_AFTER", default_value = "5m", value_parser = parse_duration)]
    pub replace_after: std::time::Duration,
    /// How long an order of a kind may go unanswered before it fails and its node is
    /// treated as broken for it: KIND=DURATION, repeatable or comma-separated. Kinds:
    /// mig_layout (2m), driver (30m), check_quick (1m), check_medium (5m), check_long
    /// (1h), slurmd (1m); a bandwidth test's duration is added to a check's.
    #[arg(long, env = "GPUFLEET_ORDER_DEADLINE", value_delimiter = ',', value_parser = parse_order_deadline, value_name = "KIND=DURATION")]
    pub order_deadline: Vec<(String, std::time::Duration)>,
    /// Reservations not yet ended that one tenant may hold; the next create is refused.
    #[arg(long, env = "GPUFLEET_MAX_OPEN_RESERVATIONS", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_open_reservations: u32,
    /// CA (PEM) that signs node agents' certificates: agents must then connect over mutual
    /// TLS with a certificate it signed. Needs --tls-cert/--tls-key.
    #[arg(long, env = "GPUFLEET_AGENT_CA", value_name = "FILE")]
    pub agent_ca: Option<PathBuf>,
    /// The agent CA's revocation list (PEM, `agents.crl` in the pki directory; `pki
    /// --revoke NAME` adds to it): a revoked certificate is refused, and its open session
    /// ended, once the list is reloaded. Needs --agent-ca.
    #[arg(long, env = "GPUFLEET_AGENT_CRL", value_name = "FILE")]
    pub agent_crl: Option<PathBuf>,
    /// How often the TLS files (--tls-cert, --tls-key, --agent-ca, --agent-crl) are looked
    /// at: when their contents changed they are loaded for the next connections, without
    /// a restart. SIGHUP looks at once.
    #[arg(long, env = "GPUFLEET_TLS_RELOAD_EVERY", default_value = "30s", value_parser = parse_duration)]
    pub tls_reload_every: std::time::Duration,
    /// The driver versions clusters may choose, comma-separated (default: the fleet file's
    /// `drivers`, else every data-center release gpufleet knows).
    #[arg(long, env = "GPUFLEET_DRIVERS", value_delimiter = ',')]
    pub drivers: Vec<String>,
    /// Allow plain http on an address other than loopback (tokens then cross the network
    /// in clear text).
    #[arg(long, env = "GPUFLEET_INSECURE")]
    pub insecure: bool,
    /// Serve Prometheus metrics (fleet, tenants, reservations, nodes, API requests, work
    /// orders) at http://ADDR/metrics (port 0 picks a free port; the address is logged).
    /// Off by default.
    #[arg(long, env = "GPUFLEET_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// File holding the bearer token a scrape must present (`Authorization: Bearer TOKEN`;
    /// Prometheus: `authorization: credentials_file:`). When absent one is generated into
    /// <data-dir>/metrics.token. A scrape without it gets 401 and no data.
    #[arg(
        long,
        env = "GPUFLEET_METRICS_TOKEN_FILE",
        value_name = "PATH",
        requires = "metrics_listen"
    )]
    pub metrics_token_file: Option<PathBuf>,
    /// Label the per-tenant series (gpufleet_tenant_gpus) with the tenant's name as well as
    /// its id; by default only the id appears, no tenant name.
    #[arg(
        long,
        env = "GPUFLEET_METRICS_TENANT_NAMES",
        requires = "metrics_listen"
    )]
    pub metrics_tenant_names: bool,
    /// For tests only: read the current time (Unix seconds) from this file on every use
    /// instead of the system clock, so a test moves time without sleeping.
    #[arg(long, env = "GPUFLEET_CLOCK_FILE", value_name = "PATH")]
    pub clock_file: Option<PathBuf>,
    /// Quick health checks on every ready node this often; 0 turns them off.
    #[arg(long, env = "GPUFLEET_HEALTH_INTERVAL", default_value = "10m", value_parser = parse_interval)]
    pub health_interval: std::time::Duration,
    /// How long each pair of nodes exchanges data in a cluster's bandwidth test.
    #[arg(long, env = "GPUFLEET_BANDWIDTH_DURATION", default_value = "1s", value_parser = parse_duration)]
    pub bandwidth_duration: std::time::Duration,
    /// The bus bandwidth a GPU model's nodes deliver between them, as MODEL=GBPS
    /// (repeatable or comma-separated), over the fleet file's `bus_bandwidth_gbps`:
    /// tenants' `acceptance.min_bus_bandwidth_gbps` for the model is refused above it.
    #[arg(long, env = "GPUFLEET_BUS_BANDWIDTH", value_delimiter = ',', value_parser = parse_bus_bandwidth, value_name = "MODEL=GBPS")]
    pub bus_bandwidth: Vec<(String, f64)>,
    /// GPU models whose hosts may skip the load tests they cannot run (no CUDA library, a
    /// driver older than CUDA 13): their tests answer "not run" instead of failing the
    /// node's checks (repeatable or comma-separated). For fleets without a fleet file
    /// (`--node-agents external`, `--hardware nvml`); a fleet file says it per group with
    /// `load_test_skip = true`. Default: none, every host must run them.
    #[arg(long, env = "GPUFLEET_LOAD_TEST_SKIP", value_delimiter = ',', value_parser = parse_model, value_name = "MODEL")]
    pub load_test_skip: Vec<String>,
    /// The automatic-quarantine breaker's window: failed health checks quarantine at most
    /// --breaker-max-quarantines (or --breaker-max-percent of a model's nodes, whichever
    /// is more) of one GPU model within it; past that the breaker opens and failed nodes
    /// stay in service until `gpufleet-agent breaker reset`. 0 turns the breaker off.
    #[arg(long, env = "GPUFLEET_BREAKER_WINDOW", default_value = "10m", value_parser = parse_interval)]
    pub breaker_window: std::time::Duration,
    /// Automatic quarantines of one model per --breaker-window (see there).
    #[arg(long, env = "GPUFLEET_BREAKER_MAX_QUARANTINES", default_value_t = 2)]
    pub breaker_max_quarantines: u32,
    /// Automatic quarantines of one model per --breaker-window, as a percentage of its
    /// nodes (when that is more than --breaker-max-quarantines).
    #[arg(long, env = "GPUFLEET_BREAKER_MAX_PERCENT", default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub breaker_max_percent: u32,
    /// How durable a commit is before its caller is answered (docs/operations.md).
    #[arg(long, env = "GPUFLEET_DURABILITY", value_enum, default_value = "full")]
    pub durability: Durability,
    /// Serve a store that holds fewer commits than its commit record says were
    /// acknowledged (a truncated or deleted WAL, an older backup put back) as it is, and
    /// reset the record; without it such a start is refused. Not for a damaged state.db.
    /// For one start: remove it from a unit's environment afterwards, or every later start
    /// would serve a lost commit without a word.
    #[arg(long, env = "GPUFLEET_ACCEPT_ROLLBACK")]
    pub accept_rollback: bool,
    /// Serve the store on the PostgreSQL database whose address is in
    /// GPUFLEET_DATABASE_URL (or --database-file), shared with any other replica, instead
    /// of the data dir's SQLite file (made by `gpufleet-agent migrate`, or empty).
    /// (--accept-rollback is the SQLite file's: refused with it.)
    #[arg(long, env = "GPUFLEET_POSTGRES", conflicts_with = "accept_rollback")]
    pub postgres: bool,
    /// A file (0600) holding the PostgreSQL store's address, with --postgres.
    #[arg(
        long,
        env = "GPUFLEET_DATABASE_FILE",
        value_name = "FILE",
        requires = "postgres"
    )]
    pub database_file: Option<PathBuf>,
    /// Nodes that registered and are not yet in service (they have not passed the
    /// control plane's admission checks, nor been returned by an operator), at most: a
    /// new name past it is refused.
    #[arg(long, env = "GPUFLEET_MAX_CANDIDATES", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_candidates: u32,
    /// Of those, registered from one source address (an IPv6 /64) at most: one holder
    /// of the join token cannot take every slot.
    #[arg(long, env = "GPUFLEET_MAX_CANDIDATES_PER_SOURCE", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_candidates_per_source: u32,
    /// A candidate node is forgotten this long after it registered or failed its checks
    /// (its name can then be registered anew); a live agent's session is ended then too,
    /// so a fake node that never passes holds its slot no longer.
    #[arg(long, env = "GPUFLEET_CANDIDATE_TTL", default_value = "1h", value_parser = parse_connection_time)]
    pub candidate_ttl: std::time::Duration,
    /// Audit entries older than this are dropped (days or hours, e.g. 90d or 36h; at
    /// most 3650d).
    #[arg(long, env = "GPUFLEET_AUDIT_KEEP", default_value = "90d", value_parser = parse_retention)]
    pub audit_keep: std::time::Duration,
    /// Audit entries of callers with a valid token kept at most, fleet-wide; the oldest go
    /// first.
    #[arg(long, env = "GPUFLEET_AUDIT_KEEP_ENTRIES", default_value_t = 200_000, value_parser = clap::value_parser!(u32).range(1..=100_000_000))]
    pub audit_keep_entries: u32,
    /// Of those, the calls of one tenant's own tokens kept at most: a team's flood ages
    /// out only its own entries (not the admin's on its objects).
    #[arg(long, env = "GPUFLEET_AUDIT_KEEP_TENANT_ENTRIES", default_value_t = 50_000, value_parser = clap::value_parser!(u32).range(1..=100_000_000))]
    pub audit_keep_tenant_entries: u32,
    /// Refusals of callers without a valid token kept at most, apart from the rest: a
    /// flood of them ages out only its own kind.
    #[arg(long, env = "GPUFLEET_AUDIT_KEEP_UNAUTHENTICATED_ENTRIES", default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(1..=100_000_000))]
    pub audit_keep_unauthenticated_entries: u32,
    /// Connections to the API open at once, at most (default: 16384, or the open-file
    /// limit less 256 when lower). Past it new connections are closed at once.
    #[arg(long, env = "GPUFLEET_MAX_CONNECTIONS", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: Option<u32>,
    /// Connections to the API open at once from one peer address, at most (default 256;
    /// every loopback address counts as one peer).
    #[arg(long, env = "GPUFLEET_MAX_CONNECTIONS_PER_PEER", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections_per_peer: Option<u32>,
    /// A connection that has sent no request within this (TLS and HTTP/2 setup
    /// included) is closed.
    #[arg(long, env = "GPUFLEET_FIRST_REQUEST_WITHIN", default_value = "10s", value_parser = parse_connection_time)]
    pub first_request_within: std::time::Duration,
    /// A connection with no request in flight for this long is closed (clients
    /// reconnect; a node agent's session is always in flight).
    #[arg(long, env = "GPUFLEET_IDLE_CONNECTION_TIMEOUT", default_value = "10m", value_parser = parse_connection_time)]
    pub idle_connection_timeout: std::time::Duration,
    /// The TCP ports every Slurm controller, slurmd and login of the platform listens on,
    /// LOW-HIGH (at least 16, none below 1024): open exactly these between the GPU hosts
    /// and to the logins. Keep them below the hosts' ephemeral ports
    /// (`net.ipv4.ip_local_port_range`). Clusters keep the ports they have; only new ones
    /// come from a changed range.
    #[arg(long, env = "GPUFLEET_SLURM_PORTS", default_value = "20000-29999", value_parser = parse_slurm_ports)]
    pub slurm_ports: gpufleet_slurm::PortRange,
    /// This replica's name as the holder of the singletons' lease (the replica that holds
    /// it runs heartbeat watch, replacement, preemption, periodic checks and Slurm
    /// supervision): 1 to 64 letters, digits, '.', '-' or '_', unique per process.
    /// Default: <host name>-<pid>.
    #[arg(long, env = "GPUFLEET_REPLICA_ID", value_parser = parse_replica_id)]
    pub replica_id: Option<String>,
    /// How long the singletons' lease lasts unrenewed (renewed every third of it): another
    /// replica takes over this long after the leader stops renewing. 3s to 5m.
    #[arg(long, env = "GPUFLEET_LEASE_TTL", default_value = "15s", value_parser = parse_lease_ttl)]
    pub lease_ttl: std::time::Duration,
    /// Where the other replicas reach this one's API, e.g. https://cp-2.example:7443: a
    /// replica that does not lead passes every call on to the one that does. Default: the
    /// scheme and port serve listens on, at the --listen address (--advertise-address
    /// when that is 0.0.0.0).
    #[arg(long, env = "GPUFLEET_API_URL", value_parser = parse_api_url)]
    pub api_url: Option<String>,
    /// The operator's price list (CSV `gpu_type,class,per_gpu_hour`, the file `replay
    /// --prices` and `usage --prices` read): GetUsage's rows grouped by gpu_type and class
    /// get their price and cost, so a team reads its cost with its own token
    /// (`gpufleet_usage`). Read at start; a malformed list is refused naming its line and
    /// column.
    #[arg(long, env = "GPUFLEET_PRICES", value_name = "FILE", value_parser = parse_prices)]
    pub prices: Option<gpufleet_control::usage_cost::PriceBook>,
}

/// `--api-url`: an http or https URL with a host, at most 256 bytes.
fn parse_api_url(text: &str) -> Result<String, String> {
    let url = text.trim();
    if url.len() > 256 {
        return Err(format!("{} bytes; at most 256", url.len()));
    }
    let uri: tonic::codegen::http::Uri = url
        .parse()
        .map_err(|e| format!("'{url}' is not a URL: {e}"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(format!(
            "'{url}': give http:// or https:// and a host, e.g. https://cp-2.example:7443"
        ));
    }
    Ok(url.trim_end_matches('/').to_string())
}

/// `--replica-id`.
fn parse_replica_id(text: &str) -> Result<String, String> {
    gpufleet_control::lease::check_replica_id(text)?;
    Ok(text.to_string())
}

/// `--prices`: the price list, read and checked as `usage --prices` reads it.
fn parse_prices(file: &str) -> Result<gpufleet_control::usage_cost::PriceBook, String> {
    gpufleet_economics::prices::load_any(std::path::Path::new(file))
        .map(|prices| crate::price_book::price_book(&prices))
        .map_err(|refusal| refusal.to_string())
}

/// `--lease-ttl`.
fn parse_lease_ttl(text: &str) -> Result<std::time::Duration, String> {
    let ttl = parse_duration(text)?;
    gpufleet_control::lease::check_ttl(ttl)?;
    Ok(ttl)
}

/// `--slurm-ports`: LOW-HIGH.
fn parse_slurm_ports(text: &str) -> Result<gpufleet_slurm::PortRange, String> {
    text.parse()
}

/// `--advertise-address`: an address others can connect to (not 0.0.0.0), IPv4 (Slurm
/// 22.05 speaks IPv6 only with `CommunicationParameters=EnableIPv6`).
pub fn parse_advertise_address(text: &str) -> Result<std::net::IpAddr, String> {
    let ip: std::net::IpAddr = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}': give an IPv4 address, e.g. 10.0.0.5"))?;
    if !ip.is_ipv4() {
        return Err(format!(
            "'{text}': an IPv4 address (the Slurm controllers speak IPv4)"
        ));
    }
    if ip.is_unspecified() {
        return Err(format!(
            "'{text}': an address others connect to, not the unspecified one"
        ));
    }
    Ok(ip)
}

/// Where Slurm controllers and logins are reached: the flag, else the --listen address
/// when it names one (not 0.0.0.0 or ::), else loopback.
pub fn advertise_address(flag: Option<std::net::IpAddr>, listen: SocketAddr) -> std::net::IpAddr {
    match flag {
        Some(ip) => ip,
        None if !listen.ip().is_unspecified() && listen.ip().is_ipv4() => listen.ip(),
        None => std::net::IpAddr::from([127, 0, 0, 1]),
    }
}

/// `--order-deadline driver=45m`.
pub fn parse_order_deadline(text: &str) -> Result<(String, std::time::Duration), String> {
    let (kind, d) = text
        .split_once('=')
        .ok_or_else(|| format!("'{text}': give KIND=DURATION, e.g. driver=45m"))?;
    let kind = kind.trim();
    let d = parse_duration(d.trim())?;
    let mut probe = gpufleet_control::deadlines::OrderDeadlines::default();
    probe.set(kind, d)?;
    Ok((kind.to_string(), d))
}

/// A catalog model's name (`--load-test-skip H200-141GB`).
pub fn parse_model(text: &str) -> Result<String, String> {
    let model = text.trim();
    gpufleet_control::catalog::require_known("GPU model", model)?;
    Ok(model.to_string())
}

/// `--bus-bandwidth H100-80GB=400`.
pub fn parse_bus_bandwidth(text: &str) -> Result<(String, f64), String> {
    let (model, gbps) = text
        .split_once('=')
        .ok_or_else(|| format!("'{text}': give MODEL=GBPS, e.g. H100-80GB=400"))?;
    let model = model.trim();
    gpufleet_control::catalog::require_known("GPU model", model)?;
    let max = gpufleet_proto::limits::MAX_BANDWIDTH_GBPS;
    match gbps.trim().parse::<f64>() {
        Ok(g) if g.is_finite() && g > 0.0 && g <= max => Ok((model.to_string(), g)),
        _ => Err(format!(
            "'{text}': the bandwidth must be a number of Gbit/s more than 0 and at most {max}"
        )),
    }
}

/// The admin commands' connection. On the control plane's host with the serve unit's
/// environment loaded (`set -a; . /etc/gpufleet/serve.env; set +a`) they need no flag:
/// the data dir is serve's `GPUFLEET_DATA_DIR`, and the endpoint and CA default to what
/// serve's `GPUFLEET_LISTEN`, `GPUFLEET_TLS_CERT` and `GPUFLEET_AGENT_CA` say.
#[derive(Args, Debug)]
pub struct ClientArgs {
    /// The control plane's address; default: the serve on this host that
    /// GPUFLEET_LISTEN and GPUFLEET_TLS_CERT describe, else http://127.0.0.1:7700.
    #[arg(long, env = "GPUFLEET_ENDPOINT", default_value = local_endpoint())]
    pub endpoint: String,
    /// Bearer token; default: the admin token in <data-dir>/admin.token.
    #[arg(long, env = "GPUFLEET_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Data directory whose admin.token is used when no token is given.
    #[arg(long, env = "GPUFLEET_DATA_DIR", default_value = "./.gpufleet")]
    pub data_dir: PathBuf,
    /// PEM of the CA that signed the control plane's certificate, for https endpoints;
    /// default: GPUFLEET_AGENT_CA when GPUFLEET_TLS_CERT is set (the pki's CA signs both).
    #[arg(long, env = "GPUFLEET_CA_CERT", value_name = "FILE", default_value = local_ca_cert())]
    pub ca_cert: Option<PathBuf>,
}

/// The endpoint of the serve this host's environment describes (see [`ClientArgs`]).
fn local_endpoint() -> &'static str {
    static ENDPOINT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ENDPOINT.get_or_init(|| {
        endpoint_of(
            std::env::var("GPUFLEET_LISTEN").ok().as_deref(),
            std::env::var_os("GPUFLEET_TLS_CERT").is_some_and(|v| !v.is_empty()),
        )
    })
}

/// The CA of the serve this host's environment describes, when it serves TLS.
fn local_ca_cert() -> Option<&'static str> {
    static CA: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    CA.get_or_init(|| {
        let tls = std::env::var_os("GPUFLEET_TLS_CERT").is_some_and(|v| !v.is_empty());
        std::env::var("GPUFLEET_AGENT_CA")
            .ok()
            .filter(|ca| tls && !ca.is_empty())
    })
    .as_deref()
}

/// The address a client on this host reaches serve's `--listen` at: localhost for an
/// unspecified address (the pki's server certificate always holds it), https when serve
/// has a certificate. The old default when `listen` is absent or does not parse (serve
/// itself refuses that).
fn endpoint_of(listen: Option<&str>, tls: bool) -> String {
    let Some(addr) = listen.and_then(|l| l.trim().parse::<SocketAddr>().ok()) else {
        return "http://127.0.0.1:7700".to_string();
    };
    let scheme = if tls { "https" } else { "http" };
    let host = match addr.ip() {
        ip if ip.is_unspecified() => "localhost".to_string(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    format!("{scheme}://{host}:{}", addr.port())
}

/// `gpufleet-agent pki`'s flags.
#[derive(Args, Debug)]
pub struct PkiArgs {
    /// Directory for the CA and the issued certificates (created when missing).
    #[arg(long, default_value = "./pki")]
    pub dir: PathBuf,
    /// Names (DNS names or IP addresses) the control plane's server certificate is valid for, besides localhost and 127.0.0.1 (always there, for admin commands on its own host); repeatable; the first is its common name. Without it a later run keeps the server certificate's names (and the certificate itself when it only issues --agent certificates).
    #[arg(long = "server-name")]
    pub server_names: Vec<String>,
    /// Issue a client certificate for this node agent name; repeatable.
    #[arg(long = "agent")]
    pub agents: Vec<String>,
    /// Revoke this node agent's current certificate (`agent-NAME.pem`): it is added to the
    /// CA's revocation list `agents.crl`, which serve reads with --agent-crl; repeatable.
    /// Nothing else is issued.
    #[arg(long = "revoke", value_name = "NAME", conflicts_with_all = ["agents", "server_names"])]
    pub revoke: Vec<String>,
}

impl From<Hardware> for gpufleet_node::hardware::Hardware {
    fn from(h: Hardware) -> Self {
        match h {
            Hardware::Sim => Self::Sim,
            Hardware::Nvml => Self::Nvml,
        }
    }
}

impl NodeArgs {
    /// The node agent's settings.
    pub fn config(self) -> gpufleet_node::Config {
        gpufleet_node::Config {
            control_planes: self.control_plane,
            join_token: self.join_token,
            join_token_file: self.join_token_file,
            name: self.name,
            data_dir: self.data_dir,
            hardware: self.hardware.into(),
            nvml_lib: self.nvml_lib,
            capacity: self.capacity.as_str().to_string(),
            gpu_type: self.gpu_type,
            gpus: self.gpus,
            sim_op_delay: std::time::Duration::from_millis(self.sim_op_delay_ms),
            driver_install_cmd: self.driver_install_cmd,
            metrics_listen: self.metrics_listen,
            ca_cert: self.ca_cert,
            cert: self.cert,
            key: self.key,
            bandwidth_listen: self.bandwidth_listen,
            bandwidth_advertise: self.bandwidth_advertise,
            keepalive: self.keepalive,
            address: self.address,
            cpus: self.cpus,
            memory_mib: self.memory_mib,
            shared_storage: self.shared_storage,
            login_limits: gpufleet_slurm::login_limits::LoginLimits {
                memory_mib: self.login_memory_mib,
                cpus: self
                    .login_cpus
                    .unwrap_or_else(gpufleet_slurm::login_limits::host_default_cpus),
                pids: self.login_pids,
            },
            job_tmp_mib: self.job_tmp_mib,
            home_mib: self.home_mib,
            slurm_cred_expire: self.slurm_cred_expire,
            stop_workloads: self.stop_workloads,
            clean: self.clean,
        }
    }
}

impl ServeArgs {
    /// The control plane's settings, given the fleet it serves (which the caller opens:
    /// NVML belongs to the node agent's crate).
    pub fn config(self, fleet: gpufleet_control::serve::Fleet) -> gpufleet_control::serve::Config {
        gpufleet_control::serve::Config {
            advertise_address: advertise_address(self.advertise_address, self.listen),
            listen: self.listen,
            insecure: self.insecure,
            tls_cert: self.tls_cert,
            tls_key: self.tls_key,
            agent_ca: self.agent_ca,
            agent_crl: self.agent_crl,
            tls_reload_every: self.tls_reload_every,
            data_dir: self.data_dir,
            shared_storage: self.shared_storage,
            fleet,
            admin_token: self.admin_token,
            join_token: self.join_token,
            drivers: self.drivers,
            node_timeout: self.node_timeout,
            replace_after: self.replace_after,
            order_deadlines: {
                let mut d = gpufleet_control::deadlines::OrderDeadlines::default();
                for (kind, within) in &self.order_deadline {
                    d.set(kind, *within).expect("checked when parsed");
                }
                d
            },
            health: gpufleet_control::scheduling::health::Settings {
                interval: self.health_interval,
                bandwidth_duration: self.bandwidth_duration,
            },
            max_open_reservations: self.max_open_reservations,
            metrics_listen: self.metrics_listen,
            metrics_token_file: self.metrics_token_file,
            metrics_tenant_names: self.metrics_tenant_names,
            clock: self
                .clock_file
                .map(gpufleet_control::clock::Clock::File)
                .unwrap_or_default(),
            delivers: gpufleet_control::fleet::Delivers::new(
                self.bus_bandwidth.into_iter().collect(),
            )
            .with_load_test_skip(self.load_test_skip),
            breaker: gpufleet_control::scheduling::breaker::Settings {
                window: self.breaker_window,
                max_quarantines: self.breaker_max_quarantines,
                max_percent: self.breaker_max_percent,
            },
            // Read by `serve::run`, which may fail on it (`database_url`).
            database: None,
            store: gpufleet_control::store::OpenOptions {
                durability: match self.durability {
                    Durability::Full => gpufleet_control::store::Durability::Full,
                    Durability::Normal => gpufleet_control::store::Durability::Normal,
                },
                on_loss: if self.accept_rollback {
                    gpufleet_control::store::commit_record::OnLoss::Accept
                } else {
                    gpufleet_control::store::commit_record::OnLoss::Refuse
                },
            },
            candidates: gpufleet_control::state::CandidateSettings {
                max: self.max_candidates,
                max_per_source: self.max_candidates_per_source,
                expire_after: self.candidate_ttl,
            },
            audit_retention: gpufleet_control::audit::Retention {
                seconds: self.audit_keep.as_secs() as i64,
                identified_rows: i64::from(self.audit_keep_entries),
                tenant_rows: i64::from(self.audit_keep_tenant_entries),
                unidentified_rows: i64::from(self.audit_keep_unauthenticated_entries),
            },
            slurm_ports: self.slurm_ports,
            connections: gpufleet_control::connections::Wanted {
                max_connections: self.max_connections.map(|n| n as usize),
                max_per_peer: self.max_connections_per_peer.map(|n| n as usize),
                first_request_within: Some(self.first_request_within),
                idle_after: Some(self.idle_connection_timeout),
            },
            lease: gpufleet_control::lease::Settings {
                replica: self
                    .replica_id
                    .unwrap_or_else(gpufleet_control::lease::default_replica_id),
                ttl: self.lease_ttl,
            },
            api_url: self.api_url,
            prices: self.prices,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_bus_bandwidth, parse_duration, parse_interval, parse_order_deadline};

    #[test]
    fn every_serve_flag_has_its_gpufleet_variable() {
        use clap::CommandFactory;
        let cli = super::Cli::command();
        let serve = cli.find_subcommand("serve").expect("the serve subcommand");
        let mut checked = 0;
        for arg in serve.get_arguments() {
            if arg.get_long().is_none() || ["help", "version"].contains(&arg.get_id().as_str()) {
                continue;
            }
            let flag = arg.get_long().unwrap_or_default();
            let env = arg
                .get_env()
                .unwrap_or_else(|| panic!("serve --{flag} has no environment variable"));
            // The flag's own name, so that an operator can guess it from --help.
            let want = format!("GPUFLEET_{}", flag.replace('-', "_").to_uppercase());
            assert_eq!(env.to_str(), Some(want.as_str()), "serve --{flag}");
            checked += 1;
        }
        assert!(checked > 30, "{checked} serve flags");
    }

    #[test]
    fn a_node_takes_several_control_plane_addresses_comma_separated_or_repeated() {
        use clap::Parser;
        let node = |args: &[&str]| {
            let cli = super::Cli::try_parse_from([&["gpufleet-agent", "node"], args].concat())
                .unwrap_or_else(|e| panic!("{args:?}: {e}"));
            match cli.command {
                super::Command::Node(node) => node.config().control_planes,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            node(&[
                "--control-plane",
                "http://a:7700,http://b:7700",
                "--control-plane",
                "http://c:7700"
            ]),
            ["http://a:7700", "http://b:7700", "http://c:7700"]
        );
        assert_eq!(
            node(&["--control-plane", "https://cp:7700"]),
            ["https://cp:7700"]
        );
    }

    #[test]
    fn admin_commands_reach_the_serve_that_its_environment_describes() {
        use super::endpoint_of;
        assert_eq!(endpoint_of(None, true), "http://127.0.0.1:7700");
        assert_eq!(endpoint_of(Some("nonsense"), true), "http://127.0.0.1:7700");
        assert_eq!(
            endpoint_of(Some("0.0.0.0:7700"), true),
            "https://localhost:7700"
        );
        assert_eq!(
            endpoint_of(Some("[::]:7701"), false),
            "http://localhost:7701"
        );
        assert_eq!(
            endpoint_of(Some("10.0.0.5:7700"), true),
            "https://10.0.0.5:7700"
        );
        assert_eq!(endpoint_of(Some("[::1]:80"), false), "http://[::1]:80");
        assert_eq!(
            endpoint_of(Some("127.0.0.1:7700"), false),
            "http://127.0.0.1:7700"
        );
    }

    #[test]
    fn the_advertised_address_is_the_flag_else_a_named_listen_address_else_loopback() {
        use super::{advertise_address, parse_advertise_address};
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let listen = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        assert_eq!(
            advertise_address(Some(ip("10.0.0.5")), listen("0.0.0.0:7700")),
            ip("10.0.0.5")
        );
        assert_eq!(
            advertise_address(None, listen("10.0.0.6:7700")),
            ip("10.0.0.6")
        );
        assert_eq!(
            advertise_address(None, listen("0.0.0.0:7700")),
            ip("127.0.0.1")
        );
        assert_eq!(
            advertise_address(None, listen("[::]:7700")),
            ip("127.0.0.1")
        );
        assert_eq!(parse_advertise_address("10.0.0.5").unwrap(), ip("10.0.0.5"));
        for bad in ["0.0.0.0", "::1", "gpu-host", "10.0.0.5:22"] {
            assert!(parse_advertise_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_overlap_may_be_none_but_not_over_seven_days() {
        use super::parse_overlap;
        use std::time::Duration;
        assert_eq!(parse_overlap("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_overlap("0s").unwrap(), Duration::ZERO);
        assert_eq!(parse_overlap("10m").unwrap(), Duration::from_secs(600));
        assert!(parse_overlap("169h").is_err());
        assert!(parse_overlap("s").is_err());
    }

    #[test]
    fn order_deadlines_name_a_known_kind_and_a_duration() {
        assert_eq!(
            parse_order_deadline("driver=45m"),
            Ok(("driver".into(), std::time::Duration::from_secs(45 * 60)))
        );
        assert!(parse_order_deadline("drivers=1m")
            .unwrap_err()
            .contains("check_medium"));
        assert!(parse_order_deadline("driver")
            .unwrap_err()
            .contains("KIND=DURATION"));
    }
    use std::time::Duration;

    /// The store options `serve` gets from `args`.
    fn store_options(args: &[&str]) -> gpufleet_control::store::OpenOptions {
        use clap::Parser;
        let cli = super::Cli::try_parse_from([&["gpufleet-agent", "serve"], args].concat())
            .expect("serve's flags parse");
        let super::Command::Serve(serve) = cli.command else {
            unreachable!("parsed as serve")
        };
        serve.config(gpufleet_control::serve::Fleet::External).store
    }

    /// The commit record's rollback is the SQLite file's: with --postgres it is refused,
    /// naming both flags.
    #[test]
    fn accept_rollback_is_refused_with_postgres() {
        use clap::Parser;
        let e = super::Cli::try_parse_from([
            "gpufleet-agent",
            "serve",
            "--postgres",
            "--accept-rollback",
        ])
        .expect_err("refused")
        .to_string();
        assert!(
            e.contains("--postgres") && e.contains("--accept-rollback"),
            "{e}"
        );
    }

    #[test]
    fn commits_are_fsynced_and_a_rollback_refused_unless_asked_otherwise() {
        use gpufleet_control::store::{commit_record::OnLoss, Durability};
        let default = store_options(&[]);
        assert_eq!(
            (default.durability, default.on_loss),
            (Durability::Full, OnLoss::Refuse)
        );
        let asked = store_options(&["--durability", "normal", "--accept-rollback"]);
        assert_eq!(
            (asked.durability, asked.on_loss),
            (Durability::Normal, OnLoss::Accept)
        );
    }

    #[test]
    fn durations_need_a_unit_and_stay_in_range() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("30").unwrap_err().contains("unit"));
        assert!(parse_duration("0s").unwrap_err().contains("more than 0"));
        assert!(parse_duration("99999999999999999999h").is_err());
        assert!(parse_duration("3d").unwrap_err().contains("unknown unit"));
        assert_eq!(parse_interval("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_interval("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_interval("soon").is_err());
    }

    #[test]
    fn bus_bandwidth_names_a_known_model_and_a_bounded_number() {
        assert_eq!(
            parse_bus_bandwidth("H100-80GB=400"),
            Ok(("H100-80GB".to_string(), 400.0))
        );
        assert!(parse_bus_bandwidth("H100-80GB")
            .unwrap_err()
            .contains("MODEL=GBPS"));
        assert!(parse_bus_bandwidth("V100=4")
            .unwrap_err()
            .contains("unknown GPU model"));
        for bad in ["H100-80GB=0", "H100-80GB=nan", "H100-80GB=1e9"] {
            assert!(
                parse_bus_bandwidth(bad).unwrap_err().contains("at most"),
                "{bad}"
            );
        }
    }

    #[test]
    fn audit_retention_is_whole_days_or_hours_within_ten_years() {
        use super::parse_retention;
        assert_eq!(parse_retention("90d").unwrap().as_secs(), 90 * 86_400);
        assert_eq!(parse_retention("36h").unwrap().as_secs(), 36 * 3600);
        assert!(parse_retention("30m")
            .unwrap_err()
            .contains("days or hours"));
        assert!(parse_retention("3651d")
            .unwrap_err()
            .contains("at most 3650d"));
        assert!(parse_retention("0h").unwrap_err().contains("at least 1h"));
        assert!(parse_retention("99999999999999999999d").is_err());
    }
}

/// `load-probe TEST MEMORY_MIB FRACTION PASSES BURN_MS BYTES SEED` (see
/// `gpufleet_gpu::load::probe`).
#[derive(Args, Debug)]
pub struct LoadProbeArgs {
    #[arg(num_args = 0.., allow_hyphen_values = true)]
    pub args: Vec<String>,
}

#[derive(Args, Debug)]
pub struct HwCheckArgs {
    /// GPU backend to inspect.
    #[arg(long, value_enum, default_value = "sim")]
    pub hardware: Hardware,
    /// With --hardware nvml: the NVML library to load instead of the system's
    /// libnvidia-ml.so.1 (e.g. a test double).
    #[arg(long, env = "GPUFLEET_NVML_LIB", value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// The health checks to run and print: quick, medium or long (each includes the lower).
    #[arg(long, default_value = "quick", value_parser = ["quick", "medium", "long"])]
    pub level: String,
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// The demand trace: `team,gpu_type,gpus,submit,duration` (optionally `,used`, the
    /// busy fraction of each job's GPUs), or an Alibaba cluster-trace-gpu-v2023 pod list.
    pub trace: PathBuf,
    /// The fleet description (TOML): pool and on-demand nodes, teams and their quotas.
    #[arg(long, value_name = "FILE")]
    pub fleet: PathBuf,
    /// The price list: `gpu_type,class,per_gpu_hour` (classes guaranteed, burst, on-demand).
    #[arg(long, value_name = "FILE")]
    pub prices: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "table")]
    pub format: ReplayFormat,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayFormat {
    Table,
    Json,
}

#[derive(Args, Debug)]
pub struct ReplaySyntheticArgs {
    /// The fleet description whose teams and models the jobs are for.
    #[arg(long, value_name = "FILE")]
    pub fleet: PathBuf,
    /// How many jobs.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=2_000_000))]
    pub rows: u32,
    /// The generator's seed: the same seed, fleet and rows give the same trace.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}
