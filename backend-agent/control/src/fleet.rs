//! The fleet definition: the fleet file (or the built-in default) and seeding the
//! simulated nodes into the store on first start.
//!
//! ```toml
//! [[pool]]
//! gpu_type = "H100-80GB"
//! nodes = 4
//! gpus_per_node = 8          # default 8
//! driver_version = "550.54.15"  # default
//! cuda_version = "12.4"         # default
//! bus_bandwidth_gbps = 400      # what the platform says these nodes deliver between
//!                               # them; tenants' acceptance thresholds are bounded by it
//! cpus_per_node = 64            # what each node declares to Slurm (default 8 per GPU)
//! memory_mib_per_node = 262144  # (default 32 GiB per GPU)
//! # The node agents' load tests (health levels medium and long; docs/guides/health-checks.md):
//! load_test_min_fraction = 0.75 # a figure below this share of the model's expected one
//!                               # fails (default 0.75)
//! load_test_skip = false        # true: a host that cannot run the load tests (no CUDA)
//!                               # answers "not run" instead of failing (default false)
//! load_test_burn_seconds = 10   # the GEMM burn's length (default: medium 10, long 120)
//!
//! [[on_demand]]
//! gpu_type = "H100-80GB"
//! nodes = 4
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context};
use gpufleet_gpu::hardware::{GpuBackend, SimulatedNode};
use gpufleet_sql::AsConn;
use serde::Deserialize;

use crate::catalog;
use crate::store::nodes::{self, GpuRow, NodeRow, ON_DEMAND, POOL};

pub use gpufleet_gpu::catalog::{DEFAULT_CUDA, DEFAULT_DRIVER};

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FleetFile {
    /// The drivers clusters may choose (empty: every release the catalog knows).
    #[serde(default)]
    pub drivers: Vec<String>,
    #[serde(default)]
    pub pool: Vec<NodeGroup>,
    #[serde(default)]
    pub on_demand: Vec<NodeGroup>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeGroup {
    pub gpu_type: String,
    pub nodes: u32,
    #[serde(default = "default_gpus_per_node")]
    pub gpus_per_node: u32,
    #[serde(default = "default_driver")]
    pub driver_version: String,
    #[serde(default = "default_cuda")]
    pub cuda_version: String,
    /// The all-reduce bus bandwidth (Gbit/s) the platform says these nodes deliver
    /// between them: a tenant's `acceptance.min_bus_bandwidth_gbps` for the model is
    /// refused above it. Every group of a model that gives it must give the same value;
    /// a model without it is bounded only by the API's maximum.
    #[serde(default)]
    pub bus_bandwidth_gbps: Option<f64>,
    /// The CPUs and memory (MiB) each node declares to Slurm; default
    /// [`SIM_CPUS_PER_GPU`] and [`SIM_MEMORY_MIB_PER_GPU`] per GPU.
    #[serde(default)]
    pub cpus_per_node: Option<u32>,
    #[serde(default)]
    pub memory_mib_per_node: Option<u64>,
    /// The load tests' judging and length for these nodes; every group of a model that
    /// sets one must set the same (they travel with each health-check order by model).
    #[serde(default)]
    pub load_test_min_fraction: Option<f64>,
    #[serde(default)]
    pub load_test_skip: Option<bool>,
    #[serde(default)]
    pub load_test_burn_seconds: Option<u32>,
}

/// How a model's nodes' load tests are judged and how long they burn (the fleet
/// groups' `load_test_*`); the default judges at the agent's default fraction, allows
/// no host to skip, and burns each level's default.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoadTests {
    /// 0: the agent's default (0.75).
    pub min_fraction: f64,
    pub skip_allowed: bool,
    /// 0: the level's default.
    pub burn_seconds: u32,
}

/// The longest burn a fleet group may ask for (the agent's own bound).
pub const MAX_BURN_SECONDS: u32 = 600;

/// What a simulated node declares to Slurm per GPU unless its group says otherwise: a GPU
/// server's share, whatever the machine that simulates it has.
pub const SIM_CPUS_PER_GPU: u32 = 8;
pub const SIM_MEMORY_MIB_PER_GPU: u64 = 32 * 1024;

/// What the fleet says it delivers per GPU model: the bus bandwidth (Gbit/s) a tenant's
/// acceptance threshold may ask for (a model not in it is bounded by the API's maximum),
/// and how its nodes' load tests are judged ([`LoadTests`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Delivers {
    bus_bandwidth_gbps: BTreeMap<String, f64>,
    load_tests: BTreeMap<String, LoadTests>,
}

impl Delivers {
    pub fn new(bus_bandwidth_gbps: BTreeMap<String, f64>) -> Self {
        Self {
            bus_bandwidth_gbps,
            load_tests: BTreeMap::new(),
        }
    }

    /// How `gpu_type`'s load tests are judged (the default when no group sets it).
    pub fn load_tests(&self, gpu_type: &str) -> LoadTests {
        self.load_tests.get(gpu_type).copied().unwrap_or_default()
    }

    /// The declared bus bandwidth of `gpu_type`, when the fleet declares one.
    pub fn bus_bandwidth_gbps(&self, gpu_type: &str) -> Option<f64> {
        self.bus_bandwidth_gbps.get(gpu_type).copied()
    }

    /// Lets hosts of these models that cannot run the load tests (no CUDA) pass with
    /// them "not run" (`serve --load-test-skip`, for fleets without a fleet file).
    pub fn with_load_test_skip(mut self, models: impl IntoIterator<Item = String>) -> Self {
        for m in models {
            self.load_tests.entry(m).or_default().skip_allowed = true;
        }
        self
    }

    /// `other`'s declarations over this one's (a load-test setting `other` leaves at its
    /// default keeps this one's).
    pub fn overridden_by(mut self, other: &Delivers) -> Self {
        self.bus_bandwidth_gbps.extend(
            other
                .bus_bandwidth_gbps
                .iter()
                .map(|(k, v)| (k.clone(), *v)),
        );
        for (model, o) in &other.load_tests {
            let t = self.load_tests.entry(model.clone()).or_default();
            t.skip_allowed |= o.skip_allowed;
            if o.min_fraction > 0.0 {
                t.min_fraction = o.min_fraction;
            }
            if o.burn_seconds > 0 {
                t.burn_seconds = o.burn_seconds;
            }
        }
        self
    }
}

impl FleetFile {
    /// The bus bandwidth each model's groups declare (validated to agree).
    pub fn delivers(&self) -> Delivers {
        let groups = || self.pool.iter().chain(&self.on_demand);
        let mut d = Delivers::new(
            groups()
                .filter_map(|g| g.bus_bandwidth_gbps.map(|b| (g.gpu_type.clone(), b)))
                .collect(),
        );
        for g in groups() {
            let t = d.load_tests.entry(g.gpu_type.clone()).or_default();
            if let Some(f) = g.load_test_min_fraction {
                t.min_fraction = f;
            }
            if let Some(s) = g.load_test_skip {
                t.skip_allowed = s;
            }
            if let Some(b) = g.load_test_burn_seconds {
                t.burn_seconds = b;
            }
        }
        d
    }
}

fn default_gpus_per_node() -> u32 {
    8
}
fn default_driver() -> String {
    DEFAULT_DRIVER.into()
}
fn default_cuda() -> String {
    DEFAULT_CUDA.into()
}

fn group(gpu_type: &str, nodes: u32) -> NodeGroup {
    NodeGroup {
        gpu_type: gpu_type.into(),
        nodes,
        gpus_per_node: 8,
        driver_version: default_driver(),
        cuda_version: default_cuda(),
        bus_bandwidth_gbps: None,
        cpus_per_node: None,
        memory_mib_per_node: None,
        load_test_min_fraction: None,
        load_test_skip: None,
        load_test_burn_seconds: None,
    }
}

/// What the built-in fleet declares for each model: its simulated nodes share one host
/// and exchange over loopback (tens of Gbit/s), so a threshold above this is refused
/// rather than left for every pair to miss.
pub const SIMULATED_BUS_BANDWIDTH_GBPS: f64 = 25.0;

/// 4 x 8 H100-80GB, 2 x 8 A100-80GB, 2 x 8 H200-141GB in the pool; 4 x 8 H100-80GB on demand.
pub fn default_fleet() -> FleetFile {
    let simulated = |g: NodeGroup| NodeGroup {
        bus_bandwidth_gbps: Some(SIMULATED_BUS_BANDWIDTH_GBPS),
        ..g
    };
    FleetFile {
        drivers: Vec::new(),
        pool: [
            group("H100-80GB", 4),
            group("A100-80GB", 2),
            group("H200-141GB", 2),
        ]
        .map(simulated)
        .to_vec(),
        on_demand: vec![simulated(group("H100-80GB", 4))],
    }
}

pub fn load(path: Option<&Path>) -> anyhow::Result<FleetFile> {
    let Some(path) = path else {
        return Ok(default_fleet());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read fleet file {}", path.display()))?;
    parse(&text).with_context(|| format!("fleet file {}", path.display()))
}

pub fn parse(text: &str) -> anyhow::Result<FleetFile> {
    let fleet: FleetFile = toml::from_str(text)?;
    validate(&fleet)?;
    Ok(fleet)
}

/// A model's groups agree on their load-test settings, each within its bounds.
fn validate_load_tests(fleet: &FleetFile) -> anyhow::Result<()> {
    let mut seen: BTreeMap<(&str, &str), String> = BTreeMap::new();
    for (table, groups) in [("pool", &fleet.pool), ("on_demand", &fleet.on_demand)] {
        for g in groups {
            if let Some(f) = g.load_test_min_fraction {
                if !f.is_finite() || f <= 0.0 || f > 1.0 {
                    bail!(
                        "{table}.load_test_min_fraction: must be more than 0 and at most 1 for {} (got {f})",
                        g.gpu_type
                    );
                }
            }
            if let Some(b) = g
                .load_test_burn_seconds
                .filter(|b| !(1..=MAX_BURN_SECONDS).contains(b))
            {
                bail!(
                    "{table}.load_test_burn_seconds: 1 to {MAX_BURN_SECONDS} for {} (got {b})",
                    g.gpu_type
                );
            }
            let set = [
                (
                    "load_test_min_fraction",
                    g.load_test_min_fraction.map(|f| f.to_string()),
                ),
                ("load_test_skip", g.load_test_skip.map(|s| s.to_string())),
                (
                    "load_test_burn_seconds",
                    g.load_test_burn_seconds.map(|b| b.to_string()),
                ),
            ];
            for (key, value) in set {
                let Some(value) = value else { continue };
                let before = seen.entry((&g.gpu_type, key)).or_insert(value.clone());
                if *before != value {
                    bail!(
                        "{table}.{key}: every group of {} that sets it must set the same (got {before} and {value})",
                        g.gpu_type
                    );
                }
            }
        }
    }
    Ok(())
}

fn validate(fleet: &FleetFile) -> anyhow::Result<()> {
    validate_load_tests(fleet)?;
    let mut gpus_per_node: BTreeMap<&str, u32> = BTreeMap::new();
    let mut bandwidth: BTreeMap<&str, f64> = BTreeMap::new();
    for (table, groups) in [("pool", &fleet.pool), ("on_demand", &fleet.on_demand)] {
        for g in groups {
            if let Some(b) = g.bus_bandwidth_gbps {
                let max = gpufleet_proto::limits::MAX_BANDWIDTH_GBPS;
                if !b.is_finite() || b <= 0.0 || b > max {
                    bail!(
                        "{table}.bus_bandwidth_gbps: must be more than 0 and at most {max} Gbit/s for {} (got {b})",
                        g.gpu_type
                    );
                }
                let seen = *bandwidth.entry(&g.gpu_type).or_insert(b);
                if seen != b {
                    bail!(
                        "{table}.bus_bandwidth_gbps: every group of {} that declares it must declare the same (got {seen} and {b})",
                        g.gpu_type
                    );
                }
            }
            catalog::require_known(&format!("{table}.gpu_type"), &g.gpu_type)
                .map_err(anyhow::Error::msg)?;
            if g.nodes == 0 {
                bail!("{table}.nodes: must be at least 1 for {}", g.gpu_type);
            }
            use gpufleet_proto::limits::{MAX_NODE_CPUS, MAX_NODE_MEMORY_MIB};
            if let Some(n) = g.cpus_per_node.filter(|n| !(1..=MAX_NODE_CPUS).contains(n)) {
                bail!(
                    "{table}.cpus_per_node: 1 to {MAX_NODE_CPUS} for {} (got {n})",
                    g.gpu_type
                );
            }
            if let Some(m) = g
                .memory_mib_per_node
                .filter(|m| !(1..=MAX_NODE_MEMORY_MIB).contains(m))
            {
                bail!(
                    "{table}.memory_mib_per_node: 1 to {MAX_NODE_MEMORY_MIB} for {} (got {m})",
                    g.gpu_type
                );
            }
            if g.gpus_per_node == 0 {
                bail!(
                    "{table}.gpus_per_node: must be at least 1 for {}",
                    g.gpu_type
                );
            }
            let seen = *gpus_per_node.entry(&g.gpu_type).or_insert(g.gpus_per_node);
            if seen != g.gpus_per_node {
                bail!(
                    "{table}.gpus_per_node: all {} nodes must have the same GPU count (got {seen} and {})",
                    g.gpu_type,
                    g.gpus_per_node
                );
            }
        }
    }
    if !fleet.drivers.is_empty() {
        crate::drivers::Offer::only(&fleet.drivers).map_err(anyhow::Error::msg)?;
    }
    if fleet.pool.is_empty() && fleet.on_demand.is_empty() {
        bail!("the fleet file defines no [[pool]] or [[on_demand]] nodes");
    }
    Ok(())
}

/// `h100-80gb-pool-01`, `h100-80gb-od-01`.
pub fn hostname(gpu_type: &str, capacity: &str, number: u32) -> String {
    let kind = if capacity == POOL { "pool" } else { "od" };
    format!("{}-{kind}-{number:02}", gpu_type.to_ascii_lowercase())
}

/// Each node the fleet file declares, as `seed` names it: its group, capacity and host
/// name, numbered per model and capacity in the file's order.
pub fn declared(fleet: &FleetFile) -> Vec<(&NodeGroup, &'static str, String)> {
    let mut numbers: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    let mut out = Vec::new();
    for (capacity, groups) in [(POOL, &fleet.pool), (ON_DEMAND, &fleet.on_demand)] {
        for g in groups {
            for _ in 0..g.nodes {
                let n = numbers.entry((g.gpu_type.as_str(), capacity)).or_insert(0);
                *n += 1;
                out.push((g, capacity, hostname(&g.gpu_type, capacity, *n)));
            }
        }
    }
    out
}

/// Creates the node rows on first start; later starts keep what the store holds.
/// Returns the number of nodes created.
/// `now` is when the nodes come into being (their `state_since`).
/// All of them or none: in a savepoint, which on SQLite outside a transaction is one of
/// its own; on PostgreSQL `conn` must be in the caller's transaction.
pub fn seed(conn: &impl AsConn, fleet: &FleetFile, now: i64) -> anyhow::Result<usize> {
    if nodes::count(conn)? > 0 {
        return Ok(0);
    }
    let tx = gpufleet_sql::Savepoint::begin(conn.as_conn())?;
    let mut created = 0;
    for (g, capacity, host) in declared(fleet) {
        let model = gpufleet_gpu::catalog::model(&g.gpu_type).expect("validated");
        let node = NodeRow {
            id: host.clone(),
            hostname: host.clone(),
            gpu_type: g.gpu_type.clone(),
            capacity: capacity.into(),
            gpu_count: g.gpus_per_node as i64,
            driver_version: g.driver_version.clone(),
            cuda_version: g.cuda_version.clone(),
            cluster_id: None,
            state: nodes::NODE_UNREACHABLE.into(),
            state_reason: "waiting for its agent to register".into(),
            state_since: now,
        };
        // The GPUs as the simulated hardware reports them (UUIDs, memory).
        let sim = SimulatedNode::new(&host, model, g.gpus_per_node, &g.driver_version);
        let reported = sim.gpus().map_err(|e| anyhow::anyhow!("{e}"))?;
        let gpus: Vec<GpuRow> = reported
            .into_iter()
            .map(|gpu| GpuRow {
                node_id: host.clone(),
                index: gpu.index as i64,
                uuid: gpu.uuid,
                model: gpu.model,
                memory_mib: gpu.memory_mib as i64,
                mig_enabled: gpu.mig_enabled,
            })
            .collect();
        nodes::insert(&tx, &node, &gpus)?;
        // Declared by the platform: in service, not a candidate.
        nodes::put_in_service(&tx, &node.id, now)?;
        // What its embedded agent declares to Slurm (it registers it again).
        nodes::set_host(
            &tx,
            &host,
            &nodes::NodeHost {
                address: "127.0.0.1".into(),
                hostname: "localhost".into(),
                cpus: g
                    .cpus_per_node
                    .unwrap_or(SIM_CPUS_PER_GPU.saturating_mul(g.gpus_per_node)),
                memory_mib: g
                    .memory_mib_per_node
                    .unwrap_or(SIM_MEMORY_MIB_PER_GPU * u64::from(g.gpus_per_node)),
                simulated: true,
            },
        )?;
        created += 1;
    }
    tx.commit()?;
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_with_defaults() {
        let f = parse("[[pool]]\ngpu_type = \"A100-40GB\"\nnodes = 2\n").unwrap();
        assert_eq!(
            f.pool,
            vec![NodeGroup {
                gpu_type: "A100-40GB".into(),
                nodes: 2,
                ..group("A100-40GB", 2)
            }]
        );
        assert!(f.on_demand.is_empty());
    }

    #[test]
    fn unknown_model_lists_the_known_ones() {
        let err = parse("[[pool]]\ngpu_type = \"V100\"\nnodes = 2\n").unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("unknown GPU model 'V100'") && text.contains("H100-80GB"),
            "{text}"
        );
    }

    #[test]
    fn rejects_zero_nodes_and_mixed_gpu_counts() {
        assert!(parse("[[pool]]\ngpu_type = \"B200\"\nnodes = 0\n").is_err());
        let mixed = "[[pool]]\ngpu_type = \"B200\"\nnodes = 1\n[[on_demand]]\ngpu_type = \"B200\"\nnodes = 1\ngpus_per_node = 4\n";
        assert!(format!("{:#}", parse(mixed).unwrap_err()).contains("same GPU count"));
    }

    #[test]
    fn a_groups_slurm_cpus_and_memory_are_bounded_and_seeded() {
        let bad = "[[pool]]\ngpu_type = \"B200\"\nnodes = 1\ncpus_per_node = 0\n";
        assert!(format!("{:#}", parse(bad).unwrap_err()).starts_with("pool.cpus_per_node: 1 to"));
        let bad = "[[pool]]\ngpu_type = \"B200\"\nnodes = 1\nmemory_mib_per_node = 0\n";
        assert!(format!("{:#}", parse(bad).unwrap_err()).starts_with("pool.memory_mib_per_node"));
        let f = parse(
            "[[pool]]\ngpu_type = \"B200\"\nnodes = 1\ngpus_per_node = 2\ncpus_per_node = 96\n",
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("s.db")).unwrap();
        seed(&conn, &f, 0).unwrap();
        let node = &nodes::list(&conn, None, None).unwrap()[0];
        let host = nodes::host(&conn, &node.id).unwrap().unwrap();
        assert_eq!(
            (host.cpus, host.memory_mib),
            (96, 2 * SIM_MEMORY_MIB_PER_GPU)
        );
    }

    #[test]
    fn load_test_settings_are_per_model_bounded_and_agreed() {
        let f = parse(
            "[[pool]]\ngpu_type = \"H200-141GB\"\nnodes = 1\nload_test_skip = true\nload_test_min_fraction = 0.5\n\
             [[on_demand]]\ngpu_type = \"H200-141GB\"\nnodes = 1\nload_test_burn_seconds = 30\n\
             [[pool]]\ngpu_type = \"B200\"\nnodes = 1\n",
        )
        .unwrap();
        let d = f.delivers();
        assert_eq!(
            d.load_tests("H200-141GB"),
            LoadTests {
                min_fraction: 0.5,
                skip_allowed: true,
                burn_seconds: 30
            }
        );
        assert_eq!(d.load_tests("B200"), LoadTests::default());
        assert_eq!(d.load_tests("L40S"), LoadTests::default());
        let flag = Delivers::default().with_load_test_skip(["B200".to_string()]);
        let both = d.overridden_by(&flag);
        assert!(both.load_tests("B200").skip_allowed);
        assert_eq!(both.load_tests("H200-141GB").burn_seconds, 30);
        for (bad, says) in [
            (
                "load_test_min_fraction = 0",
                "pool.load_test_min_fraction: must be more than 0",
            ),
            (
                "load_test_min_fraction = 1.5",
                "pool.load_test_min_fraction: must be more than 0",
            ),
            (
                "load_test_burn_seconds = 601",
                "pool.load_test_burn_seconds: 1 to 600",
            ),
        ] {
            let e = format!(
                "{:#}",
                parse(&format!(
                    "[[pool]]\ngpu_type = \"B200\"\nnodes = 1\n{bad}\n"
                ))
                .unwrap_err()
            );
            assert!(e.contains(says), "{e}");
        }
        let disagree = "[[pool]]\ngpu_type = \"B200\"\nnodes = 1\nload_test_skip = true\n\
            [[on_demand]]\ngpu_type = \"B200\"\nnodes = 1\nload_test_skip = false\n";
        let e = format!("{:#}", parse(disagree).unwrap_err());
        assert!(
            e.contains("on_demand.load_test_skip: every group of B200"),
            "{e}"
        );
    }

    #[test]
    fn declared_bus_bandwidth_is_per_model_and_checked() {
        let f = parse(
            "[[pool]]\ngpu_type = \"B200\"\nnodes = 1\nbus_bandwidth_gbps = 400\n\
             [[on_demand]]\ngpu_type = \"B200\"\nnodes = 1\n\
             [[pool]]\ngpu_type = \"A100-40GB\"\nnodes = 1\n",
        )
        .unwrap();
        let d = f.delivers();
        assert_eq!(d.bus_bandwidth_gbps("B200"), Some(400.0));
        assert_eq!(d.bus_bandwidth_gbps("A100-40GB"), None);
        for bad in ["0", "-1", "nan", "100001"] {
            let text =
                format!("[[pool]]\ngpu_type = \"B200\"\nnodes = 1\nbus_bandwidth_gbps = {bad}\n");
            let e = format!("{:#}", parse(&text).unwrap_err());
            assert!(
                e.contains("pool.bus_bandwidth_gbps: must be more than 0"),
                "{bad}: {e}"
            );
        }
        let disagree = "[[pool]]\ngpu_type = \"B200\"\nnodes = 1\nbus_bandwidth_gbps = 400\n\
            [[on_demand]]\ngpu_type = \"B200\"\nnodes = 1\nbus_bandwidth_gbps = 200\n";
        let e = format!("{:#}", parse(disagree).unwrap_err());
        assert!(
            e.contains("on_demand.bus_bandwidth_gbps: every group of B200"),
            "{e}"
        );
        // The built-in fleet declares what loopback delivers.
        assert_eq!(
            default_fleet().delivers().bus_bandwidth_gbps("H100-80GB"),
            Some(SIMULATED_BUS_BANDWIDTH_GBPS)
        );
    }

    #[test]
    fn hostnames_are_stable() {
        assert_eq!(hostname("H100-80GB", POOL, 1), "h100-80gb-pool-01");
        assert_eq!(hostname("H100-80GB", ON_DEMAND, 12), "h100-80gb-od-12");
    }

    #[test]
    fn seeds_once() {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("s.db")).unwrap();
        assert_eq!(seed(&conn, &default_fleet(), 0).unwrap(), 12);
        assert_eq!(seed(&conn, &default_fleet(), 0).unwrap(), 0);
        let pool: Vec<_> = nodes::list(&conn, Some("H100-80GB"), None)
            .unwrap()
            .into_iter()
            .filter(|n| n.capacity == POOL)
            .collect();
        assert_eq!(pool.len(), 4);
        // Seeded nodes are handed out only once their agents have registered.
        assert!(pool.iter().all(|n| n.state == nodes::NODE_UNREACHABLE));
        assert!(nodes::free(&conn, "H100-80GB", POOL).unwrap().is_empty());
        let gpus = nodes::gpus(&conn, &pool[0].id).unwrap();
        assert_eq!(gpus.len(), 8);
        assert!(gpus[0].uuid.starts_with("GPU-") && gpus[0].uuid != gpus[1].uuid);
    }

    /// On either engine in the caller's transaction (on PostgreSQL it must be in one), and
    /// on SQLite outside any, where its savepoint is a transaction of its own.
    #[test]
    fn seeds_once_on_either_engine() {
        for (_guard, mut db) in crate::store::postgres::engines::both() {
            let engine = db.engine();
            let seeded = |db: &mut gpufleet_sql::Database| {
                db.write(|c| Ok(seed(c, &default_fleet(), 0).map_err(|e| e.to_string())))
                    .unwrap()
                    .unwrap()
            };
            assert_eq!(seeded(&mut db), 12, "{engine:?}");
            assert_eq!(seeded(&mut db), 0, "{engine:?}");
            let all = db.read(|c| nodes::list(c, None, None)).unwrap();
            assert_eq!(all.len(), 12, "{engine:?}");
            assert!(all.iter().all(|n| n.state == nodes::NODE_UNREACHABLE));
            let gpus = db.read(|c| nodes::gpus(c, &all[0].id)).unwrap();
            assert_eq!(gpus.len() as i64, all[0].gpu_count, "{engine:?}");
            let host = db.read(|c| nodes::host(c, &all[0].id)).unwrap().unwrap();
            assert_eq!(host.address, "127.0.0.1", "{engine:?}");
        }
        let (_guard, db) = crate::store::postgres::engines::sqlite();
        assert_eq!(seed(&db.conn(), &default_fleet(), 0).unwrap(), 12);
        assert_eq!(
            db.conn()
                .query_row("SELECT COUNT(*) FROM nodes", gpufleet_sql::params![], |r| r
                    .get::<i64>(0))
                .unwrap(),
            12
        );
    }
}
