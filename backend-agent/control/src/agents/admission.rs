//! Registration against the store: a new node joins the fleet with what its agent
//! reports; a known node must report the same model, capacity and GPUs (compared by
//! UUID as a set: index order is not stable across reboots), and its MIG state and
//! versions are refreshed from the report, which is the truth.

use std::collections::BTreeSet;

use gpufleet_gpu::hardware::GpuInfo;
use gpufleet_proto::v1;
use gpufleet_sql::AsConn;

use gpufleet_wire::protocol_version::Version;

use crate::store::nodes::{self, GpuRow, NodeRow, NODE_BUSY, ON_DEMAND, POOL};

/// Most GPUs one node may report.
pub const MAX_GPUS: usize = 64;
/// Longest GPU UUID, driver or CUDA version accepted.
const MAX_TEXT: usize = 128;

/// Why a registration is refused.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("{0}")]
    Invalid(String),
    /// What the agent reports contradicts the record for its name.
    #[error("{0}")]
    Contradiction(String),
    /// The agent speaks a protocol version this control plane does not work with.
    #[error("{0}")]
    Unsupported(String),
    /// The name is bound to another host: its secret was not presented.
    #[error("{0}")]
    Impostor(String),
    /// Too many nodes wait to be admitted already.
    #[error("{0}")]
    Full(String),
    #[error("state database error: {0}")]
    Store(#[from] rusqlite::Error),
}

/// The store's functions on the engine seam fail with `gpufleet_sql`'s errors: SQLite's
/// within them come out as they were.
impl From<gpufleet_sql::Error> for Refusal {
    fn from(e: gpufleet_sql::Error) -> Self {
        Refusal::Store(e.into())
    }
}

/// A registration's content, checked.
pub struct Checked {
    pub name: String,
    pub capacity: String,
    pub gpu_type: String,
    pub driver_version: String,
    pub cuda_version: String,
    pub gpus: Vec<GpuInfo>,
    /// The node secret presented ("" at a first registration).
    pub secret: String,
    /// The Slurm clusters whose daemons the agent kept from before.
    pub slurm_clusters: Vec<String>,
    /// The host as Slurm declares the node.
    pub host: nodes::NodeHost,
    /// The agent's release and protocol.
    pub version: Version,
    /// Why the host cannot isolate a tenant's cluster ("" when it can).
    pub isolation_problem: String,
}

/// Most characters of a registration's `isolation_problem`.
pub const MAX_ISOLATION_PROBLEM: usize = 1024;

/// Most kept Slurm clusters one registration may name.
const MAX_KEPT_CLUSTERS: usize = 64;

/// A registration let in: the node's id, and its new secret when one was issued now.
pub struct Admitted {
    pub id: String,
    pub issued_secret: Option<String>,
}

/// Prefix of the node secrets the control plane issues.
const SECRET_PREFIX: &str = "gfn_";

fn bounded(field: &str, value: &str) -> Result<(), Refusal> {
    if value.len() > MAX_TEXT {
        return Err(Refusal::Invalid(format!(
            "{field}: at most {MAX_TEXT} characters (got {})",
            value.len()
        )));
    }
    Ok(())
}

pub fn check(reg: &v1::RegisterNode) -> Result<Checked, Refusal> {
    // First: an agent of a protocol this control plane does not speak may mean anything
    // by the rest.
    let version = check_version(reg)?;
    gpufleet_wire::names::dns_label("name", &reg.name).map_err(Refusal::Invalid)?;
    if reg.capacity != POOL && reg.capacity != ON_DEMAND {
        return Err(Refusal::Invalid(format!(
            "capacity: must be \"pool\" or \"on-demand\" (got \"{}\")",
            reg.capacity.chars().take(32).collect::<String>()
        )));
    }
    let inv = reg
        .inventory
        .as_ref()
        .ok_or_else(|| Refusal::Invalid("inventory: missing".into()))?;
    let gpus = check_inventory(inv)?;
    bounded("node_secret", &reg.node_secret)?;
    if reg.slurm_clusters.len() > MAX_KEPT_CLUSTERS {
        return Err(Refusal::Invalid(format!(
            "slurm_clusters: at most {MAX_KEPT_CLUSTERS} (got {})",
            reg.slurm_clusters.len()
        )));
    }
    if let Some(bad) = reg
        .slurm_clusters
        .iter()
        .find(|c| !gpufleet_slurm::valid_cluster_name(c))
    {
        return Err(Refusal::Invalid(format!(
            "slurm_clusters: {:?} is not a Slurm cluster name",
            bad.chars().take(64).collect::<String>()
        )));
    }
    if !KNOWN_HARDWARE.contains(&reg.hardware.as_str()) {
        return Err(Refusal::Invalid(format!(
            "hardware: one of {} (got {:?})",
            KNOWN_HARDWARE.join(", "),
            reg.hardware.chars().take(32).collect::<String>()
        )));
    }
    check_bandwidth_addr(&reg.bandwidth_addr)?;
    let host = check_host(reg)?;
    if reg.isolation_problem.chars().count() > MAX_ISOLATION_PROBLEM {
        return Err(Refusal::Invalid(format!(
            "isolation_problem: at most {MAX_ISOLATION_PROBLEM} characters (got {})",
            reg.isolation_problem.chars().count()
        )));
    }
    Ok(Checked {
        isolation_problem: crate::audit::text::escaped(
            &reg.isolation_problem,
            MAX_ISOLATION_PROBLEM,
        ),
        version,
        host,
        secret: reg.node_secret.clone(),
        slurm_clusters: reg.slurm_clusters.clone(),
        name: reg.name.clone(),
        capacity: reg.capacity.clone(),
        gpu_type: inv.gpu_type.clone(),
        driver_version: inv.driver_version.clone(),
        cuda_version: inv.cuda_version.clone(),
        gpus,
    })
}

/// The hardware backends a node agent runs (`gpufleet-agent node --hardware`).
pub const KNOWN_HARDWARE: [&str; 2] = ["sim", "nvml"];

/// Longest `bandwidth_addr`: a DNS name (253) and a port.
const MAX_BANDWIDTH_ADDR: usize = 253 + 6;

/// Where peers reach the node's bandwidth listener: empty (none), or `HOST:PORT` with an
/// IP address or a DNS name and a port from 1 to 65535.
fn check_bandwidth_addr(addr: &str) -> Result<(), Refusal> {
    if addr.is_empty() {
        return Ok(());
    }
    let refused = |why: &str| {
        Refusal::Invalid(format!(
            "bandwidth_addr: {why} (got {:?})",
            addr.chars().take(64).collect::<String>()
        ))
    };
    if addr.len() > MAX_BANDWIDTH_ADDR {
        return Err(refused(&format!(
            "at most {MAX_BANDWIDTH_ADDR} characters, HOST:PORT"
        )));
    }
    if addr
        .parse::<std::net::SocketAddr>()
        .is_ok_and(|a| a.port() != 0)
    {
        return Ok(());
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err(refused("HOST:PORT, with a port"));
    };
    if !port.parse::<u16>().is_ok_and(|p| p != 0) {
        return Err(refused("the port is 1 to 65535"));
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if !host.split('.').all(label_ok) {
        return Err(refused("the host is an IP address or a DNS name"));
    }
    Ok(())
}

/// The host as the agent declares it to Slurm: an IPv4 address others reach, a host name,
/// CPUs and memory within bounds. Empty or 0 (an agent that does not report them): this
/// host's loopback, `localhost`, 1 CPU, Slurm's default memory.
fn check_host(reg: &v1::RegisterNode) -> Result<nodes::NodeHost, Refusal> {
    use gpufleet_proto::limits::{MAX_HOSTNAME_CHARS, MAX_NODE_CPUS, MAX_NODE_MEMORY_MIB};
    let shown = |v: &str| v.chars().take(64).collect::<String>();
    let address = match reg.slurm_address.as_str() {
        "" => "127.0.0.1".to_string(),
        a => match a.parse::<std::net::Ipv4Addr>() {
            Ok(ip) if !ip.is_unspecified() && !ip.is_broadcast() && !ip.is_multicast() => {
                ip.to_string()
            }
            _ => {
                return Err(Refusal::Invalid(format!(
                    "slurm_address: an IPv4 address the controller can reach, not {:?}",
                    shown(a)
                )))
            }
        },
    };
    let hostname = match reg.slurm_hostname.as_str() {
        "" => "localhost".to_string(),
        h if h.len() <= MAX_HOSTNAME_CHARS
            && h.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
            && !h.starts_with(['.', '-']) =>
        {
            h.to_string()
        }
        h => {
            return Err(Refusal::Invalid(format!(
                "slurm_hostname: at most {MAX_HOSTNAME_CHARS} letters, digits, '.', '-' or '_' (got {:?})",
                shown(h)
            )))
        }
    };
    let cpus = match reg.cpus {
        0 => 1,
        n if n <= MAX_NODE_CPUS => n,
        n => {
            return Err(Refusal::Invalid(format!(
                "cpus: 1 to {MAX_NODE_CPUS} (got {n})"
            )))
        }
    };
    if reg.memory_mib > MAX_NODE_MEMORY_MIB {
        return Err(Refusal::Invalid(format!(
            "memory_mib: at most {MAX_NODE_MEMORY_MIB} (got {})",
            reg.memory_mib
        )));
    }
    Ok(nodes::NodeHost {
        address,
        hostname,
        cpus,
        memory_mib: reg.memory_mib,
        simulated: reg.hardware == "sim",
    })
}

/// How far a GPU's reported memory may be from its model's (NVML reports a little less
/// than the marketing figure: 81559 MiB for an 80 GB H100).
const MEMORY_TOLERANCE_PERCENT: u64 = 10;

/// An inventory (a registration's, or an order result's) that is one real node: a known
/// model, bounded versions, 1 to [`MAX_GPUS`] GPUs in index order with distinct UUIDs,
/// every GPU of the node's model with its memory, and MIG devices that are the model's
/// profiles at valid, non-overlapping places on a GPU in MIG mode.
pub fn check_inventory(inv: &v1::NodeInventory) -> Result<Vec<GpuInfo>, Refusal> {
    crate::catalog::require_known("inventory.gpu_type", &inv.gpu_type).map_err(Refusal::Invalid)?;
    let model = gpufleet_gpu::catalog::model(&inv.gpu_type)
        .ok_or_else(|| Refusal::Invalid("inventory.gpu_type: unknown".into()))?;
    version_text("inventory.driver_version", &inv.driver_version)?;
    version_text("inventory.cuda_version", &inv.cuda_version)?;
    if inv.gpus.is_empty() || inv.gpus.len() > MAX_GPUS {
        return Err(Refusal::Invalid(format!(
            "inventory.gpus: a node has 1 to {MAX_GPUS} GPUs (got {})",
            inv.gpus.len()
        )));
    }
    let mut gpus = Vec::with_capacity(inv.gpus.len());
    let mut uuids = BTreeSet::new();
    for (pos, g) in inv.gpus.iter().enumerate() {
        let info = gpufleet_wire::inventory::gpu_info(g).map_err(Refusal::Invalid)?;
        let field = |f: &str| format!("inventory.gpus[{pos}].{f}");
        if info.index as usize != pos {
            return Err(Refusal::Invalid(format!(
                "{}: GPUs are listed in index order (got {})",
                field("index"),
                info.index
            )));
        }
        bounded(&field("uuid"), &info.uuid)?;
        if info.uuid.is_empty() || !uuids.insert(info.uuid.clone()) {
            return Err(Refusal::Invalid(format!(
                "{}: empty or repeated",
                field("uuid")
            )));
        }
        if info.model != model.name {
            return Err(Refusal::Contradiction(format!(
                "{}: the node is a {} node, but this GPU reports {}",
                field("model"),
                model.name,
                info.model.chars().take(64).collect::<String>()
            )));
        }
        let (low, high) = (
            model.memory_mib * (100 - MEMORY_TOLERANCE_PERCENT) / 100,
            model.memory_mib * (100 + MEMORY_TOLERANCE_PERCENT) / 100,
        );
        if !(low..=high).contains(&info.memory_mib) {
            return Err(Refusal::Contradiction(format!(
                "{}: a {} has about {} MiB (got {})",
                field("memory_mib"),
                model.name,
                model.memory_mib,
                info.memory_mib
            )));
        }
        check_mig_devices(model, &info, &field("mig_devices"))?;
        gpus.push(info);
    }
    Ok(gpus)
}

/// The agent's release and protocol, refused (FAILED_PRECONDITION: the agent gives up
/// rather than retry) when this control plane does not work with it, naming both ends'
/// versions.
pub fn check_version(reg: &v1::RegisterNode) -> Result<Version, Refusal> {
    version_text("release", &reg.release)?;
    let agent = Version::peer(&reg.release, reg.protocol);
    if agent.supported() {
        return Ok(agent);
    }
    Err(Refusal::Unsupported(format!(
        "protocol: this agent is {agent} and this control plane is {} (it accepts agents of protocols {}); {}",
        Version::ours(),
        gpufleet_wire::protocol_version::accepted(),
        agent.remedy("agent", "control plane")
    )))
}

/// A version as drivers and CUDA print them: bounded, of digits, letters, dots and dashes.
fn version_text(field: &str, value: &str) -> Result<(), Refusal> {
    bounded(field, value)?;
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+')))
    {
        return Err(Refusal::Invalid(format!(
            "{field}: not a version ({bad:?} is not a digit, letter, '.', '-', '_' or '+')"
        )));
    }
    Ok(())
}

/// A GPU's MIG devices: only in MIG mode, each a profile of the model at one of its
/// valid starts, none overlapping, each with a bounded UUID.
fn check_mig_devices(
    model: &gpufleet_gpu::catalog::GpuModel,
    gpu: &GpuInfo,
    field: &str,
) -> Result<(), Refusal> {
    if gpu.instances.is_empty() {
        return Ok(());
    }
    if !gpu.mig_enabled {
        return Err(Refusal::Contradiction(format!(
            "{field}: MIG devices on a GPU that is not in MIG mode"
        )));
    }
    let mut used = 0u16; // one bit per memory slice
    for (i, d) in gpu.instances.iter().enumerate() {
        bounded(&format!("{field}[{i}].uuid"), &d.uuid)?;
        let Some(p) = model.profile(&d.profile).filter(|p| p.id == d.profile_id) else {
            return Err(Refusal::Invalid(format!(
                "{field}[{i}].profile: {} (id {}) is not a {} profile",
                d.profile.chars().take(32).collect::<String>(),
                d.profile_id,
                model.name
            )));
        };
        if d.size != p.memory_slices || !p.valid_starts.contains(&d.start) {
            return Err(Refusal::Invalid(format!(
                "{field}[{i}]: {} cannot sit at slices {}..{}",
                p.name,
                d.start,
                u16::from(d.start) + u16::from(d.size)
            )));
        }
        let bits = ((1u16 << d.size) - 1) << d.start;
        if used & bits != 0 {
            return Err(Refusal::Contradiction(format!(
                "{field}[{i}]: {} at slice {} overlaps another device",
                p.name, d.start
            )));
        }
        used |= bits;
    }
    Ok(())
}

/// A new secret for `node_id`: recorded as its hash, given back once to send.
fn issue_secret(tx: &impl AsConn, node_id: &str) -> Result<String, Refusal> {
    let secret = crate::auth::new_token(SECRET_PREFIX);
    nodes::set_secret_hash(tx, node_id, &crate::auth::hash_token(&secret))?;
    Ok(secret)
}

/// A known node's registration must present the secret issued to its name (a node with
/// none recorded, from before secrets, is issued one now).
fn check_secret(tx: &impl AsConn, known: &NodeRow, c: &Checked) -> Result<Option<String>, Refusal> {
    let hash = nodes::secret_hash(tx, &known.id)?;
    if hash.is_empty() {
        return issue_secret(tx, &known.id).map(Some);
    }
    let presented = crate::auth::hash_token(&c.secret);
    if c.secret.is_empty() || !crate::auth::same_token(&presented, &hash) {
        return Err(Refusal::Impostor(format!(
            "name: node {} is bound to the host that first registered it, and this registration does not present its node secret (the node.secret in that agent's data dir); give a new host its own --name, or have an operator release the name: gpufleet-agent node-forget-secret {}",
            c.name, c.name
        )));
    }
    Ok(None)
}

/// The slots a new name joins in: the candidates' bounds, and where it registers from.
#[derive(Debug, Clone, Copy)]
pub struct Slots<'a> {
    /// Candidates at most (serve --max-candidates).
    pub max: u32,
    /// Candidates from one source at most (serve --max-candidates-per-source).
    pub per_source: u32,
    /// The registering peer, as [`source_of`] names it.
    pub source: &'a str,
}

/// A registering peer's source: its address, or for IPv6 its /64 (a host is given a
/// whole /64, so its addresses count as one).
pub fn source_of(peer: std::net::IpAddr) -> String {
    match peer {
        std::net::IpAddr::V4(v4) => v4.to_string(),
        std::net::IpAddr::V6(v6) => {
            let net = u128::from(v6) & !((1u128 << 64) - 1);
            format!("{}/64", std::net::Ipv6Addr::from(net))
        }
    }
}

/// Adds the node or checks it against its record (its secret first); records its GPUs'
/// MIG state. The node is `busy` until the control plane has brought it to what it
/// should be. A new name joins as a candidate, and only while fewer than `slots.max`
/// wait and fewer than `slots.per_source` of them came from its source. Runs inside the
/// caller's transaction (a refusal leaves it to be rolled back).
pub fn admit(tx: &impl AsConn, c: &Checked, now: i64, slots: &Slots) -> Result<Admitted, Refusal> {
    let issued_secret;
    let id = match nodes::by_hostname(tx, &c.name)? {
        None => {
            let from_source = nodes::candidates_from(tx, slots.source)?;
            if from_source >= i64::from(slots.per_source) {
                return Err(Refusal::Full(format!(
                    "name: {from_source} nodes registered from {} are waiting to be admitted already (serve --max-candidates-per-source {}); node {} may register once they are in service or forgotten (serve --candidate-ttl)",
                    slots.source, slots.per_source, c.name
                )));
            }
            let waiting = nodes::candidates(tx)?;
            if waiting >= i64::from(slots.max) {
                return Err(Refusal::Full(format!(
                    "name: {waiting} nodes are waiting to be admitted already (serve --max-candidates {}); node {} may register once they are in service or forgotten (serve --candidate-ttl)",
                    slots.max, c.name
                )));
            }
            let row = NodeRow {
                id: c.name.clone(),
                hostname: c.name.clone(),
                gpu_type: c.gpu_type.clone(),
                capacity: c.capacity.clone(),
                gpu_count: c.gpus.len() as i64,
                driver_version: c.driver_version.clone(),
                cuda_version: c.cuda_version.clone(),
                cluster_id: None,
                state: NODE_BUSY.into(),
                state_reason: "registered; being checked".into(),
                state_since: now,
            };
            let gpus: Vec<GpuRow> = c
                .gpus
                .iter()
                .map(|g| GpuRow {
                    node_id: row.id.clone(),
                    index: g.index as i64,
                    uuid: g.uuid.clone(),
                    model: g.model.clone(),
                    memory_mib: g.memory_mib as i64,
                    mig_enabled: g.mig_enabled,
                })
                .collect();
            if let Some(taken) = c.gpus.iter().find_map(|g| {
                nodes::owner_of_gpu(tx, &g.uuid)
                    .map(|o| o.map(|o| (g.uuid.clone(), o)))
                    .transpose()
            }) {
                let (uuid, owner) = taken?;
                return Err(Refusal::Contradiction(format!(
                    "node {}: GPU {uuid} is already recorded on node {owner}",
                    c.name
                )));
            }
            nodes::insert(tx, &row, &gpus)?;
            nodes::set_joined_from(tx, &row.id, slots.source)?;
            issued_secret = Some(issue_secret(tx, &row.id)?);
            tracing::info!(node = %c.name, gpus = gpus.len(), model = %c.gpu_type, "a new node joined the fleet");
            row.id
        }
        Some(known) => {
            issued_secret = check_secret(tx, &known, c)?;
            contradiction(tx, &known, c)?;
            nodes::set_versions(tx, &known.id, &c.driver_version, &c.cuda_version)?;
            // A quarantined node stays out of service whatever its agent does.
            if known.state != nodes::NODE_QUARANTINED {
                nodes::set_state(tx, &known.id, NODE_BUSY, "registered; being checked", now)?;
            }
            known.id
        }
    };
    nodes::set_host(tx, &id, &c.host)?;
    for g in &c.gpus {
        nodes::set_mig_state(
            tx,
            &id,
            g.index as i64,
            g.mig_enabled,
            &crate::recorded::mig_device_rows(g),
        )?;
    }
    Ok(Admitted { id, issued_secret })
}

/// What a known node reports must match its record, except MIG state and versions.
fn contradiction(conn: &impl AsConn, known: &NodeRow, c: &Checked) -> Result<(), Refusal> {
    let differs = |what: &str, recorded: &str, reported: &str| {
        Refusal::Contradiction(format!(
            "node {}: the control plane recorded {what} {recorded}, the agent reports {reported}; \
             a node keeps its name only with the same hardware (use a new --name for a new host)",
            c.name
        ))
    };
    if known.gpu_type != c.gpu_type {
        return Err(differs("GPU model", &known.gpu_type, &c.gpu_type));
    }
    if known.capacity != c.capacity {
        return Err(differs("capacity", &known.capacity, &c.capacity));
    }
    let recorded: BTreeSet<String> = nodes::gpus(conn, &known.id)?
        .into_iter()
        .map(|g| g.uuid)
        .collect();
    let reported: BTreeSet<String> = c.gpus.iter().map(|g| g.uuid.clone()).collect();
    if recorded != reported {
        let missing: Vec<&String> = recorded.difference(&reported).take(3).collect();
        let extra: Vec<&String> = reported.difference(&recorded).take(3).collect();
        return Err(Refusal::Contradiction(format!(
            "node {}: the control plane recorded {} GPUs, the agent reports {}; recorded but not reported: {missing:?}; reported but not recorded: {extra:?}",
            c.name,
            recorded.len(),
            reported.len()
        )));
    }
    // Same UUIDs, possibly at other indexes: the records follow the hardware. (MIG
    // devices are recorded again right after, from the report.)
    let moved = nodes::gpus(conn, &known.id)?.iter().any(|row| {
        c.gpus
            .iter()
            .any(|g| g.uuid == row.uuid && g.index as i64 != row.index)
    });
    if moved {
        let order: Vec<(String, i64)> = c
            .gpus
            .iter()
            .map(|g| (g.uuid.clone(), g.index as i64))
            .collect();
        nodes::reindex_gpus(conn, &known.id, &order)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    use super::*;

    /// `admit` in a transaction of its own, kept when it succeeds.
    fn admitted(conn: &mut Connection, c: &Checked, now: i64) -> Result<Admitted, Refusal> {
        let tx = conn.transaction()?;
        let slots = Slots {
            max: 64,
            per_source: 64,
            source: "10.0.0.1",
        };
        let a = admit(&tx, c, now, &slots)?;
        tx.commit()?;
        Ok(a)
    }

    /// `check`, presenting `secret`.
    fn with_secret(reg: &v1::RegisterNode, secret: &str) -> Checked {
        let mut reg = reg.clone();
        reg.node_secret = secret.into();
        check(&reg).unwrap()
    }

    fn registration(name: &str, uuids: &[&str]) -> v1::RegisterNode {
        v1::RegisterNode {
            name: name.into(),
            capacity: POOL.into(),
            hardware: "sim".into(),
            bandwidth_addr: String::new(),
            node_secret: String::new(),
            slurm_clusters: Vec::new(),
            slurm_address: String::new(),
            slurm_hostname: String::new(),
            cpus: 0,
            memory_mib: 0,
            isolation_problem: String::new(),
            release: gpufleet_wire::protocol_version::RELEASE.into(),
            protocol: Some(gpufleet_wire::protocol_version::PROTOCOL),
            inventory: Some(v1::NodeInventory {
                gpu_type: "H100-80GB".into(),
                driver_version: "550.54.15".into(),
                cuda_version: "12.4".into(),
                gpus: uuids
                    .iter()
                    .enumerate()
                    .map(|(i, u)| v1::Gpu {
                        index: i as i32,
                        uuid: u.to_string(),
                        model: "H100-80GB".into(),
                        memory_mib: 81559,
                        ..Default::default()
                    })
                    .collect(),
            }),
        }
    }

    #[test]
    fn one_source_holds_at_most_its_share_of_the_candidate_slots() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = crate::store::open(&dir.path().join("s.db")).unwrap();
        let mut join = |name: &str, source: &str| {
            let reg = registration(name, &[&format!("GPU-{name}")]);
            let tx = conn.transaction().unwrap();
            let slots = Slots {
                max: 4,
                per_source: 2,
                source,
            };
            let a = admit(&tx, &check(&reg).unwrap(), 1, &slots);
            tx.commit().unwrap();
            a.map(|a| a.id).map_err(|e| e.to_string())
        };
        join("fake-1", "192.0.2.9").unwrap();
        join("fake-2", "192.0.2.9").unwrap();
        let refused = join("fake-3", "192.0.2.9").unwrap_err();
        assert!(
            refused.starts_with("name: 2 nodes registered from 192.0.2.9 are waiting")
                && refused.contains("--max-candidates-per-source 2"),
            "{refused}"
        );
        // Another source still joins, up to the bound of all candidates.
        join("real-1", "198.51.100.7").unwrap();
        join("real-2", "203.0.113.5").unwrap();
        assert!(join("real-3", "203.0.113.6")
            .unwrap_err()
            .contains("--max-candidates 4"));
        // IPv6 hosts count per /64.
        let a = source_of("2001:db8:1:2::5".parse().unwrap());
        assert_eq!(a, "2001:db8:1:2::/64");
        assert_eq!(source_of("2001:db8:1:2:ffff::1".parse().unwrap()), a);
        assert_eq!(source_of("10.1.2.3".parse().unwrap()), "10.1.2.3");
    }

    #[test]
    fn a_known_node_must_bring_the_same_gpus_and_stays_quarantined() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = crate::store::open(&dir.path().join("s.db")).unwrap();
        let reg = registration("n1", &["GPU-a", "GPU-b"]);
        let first = admitted(&mut conn, &check(&reg).unwrap(), 1).unwrap();
        let (id, secret) = (
            first.id,
            first
                .issued_secret
                .expect("a first registration gets a secret"),
        );
        // Same GPUs in another index order: the same node, re-indexed.
        let swapped = registration("n1", &["GPU-b", "GPU-a"]);
        let again = admitted(&mut conn, &with_secret(&swapped, &secret), 2).unwrap();
        assert!(again.issued_secret.is_none());
        let gpus = nodes::gpus(&conn, &id).unwrap();
        assert_eq!(
            (gpus[0].uuid.as_str(), gpus[1].uuid.as_str()),
            ("GPU-b", "GPU-a")
        );
        // Other GPUs under the name: refused, naming both sides.
        let other = registration("n1", &["GPU-a", "GPU-c"]);
        let e = admitted(&mut conn, &with_secret(&other, &secret), 3)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("GPU-b") && e.contains("GPU-c"), "{e}");
        // A GPU another node holds: refused.
        let thief = registration("n2", &["GPU-a"]);
        let e = admitted(&mut conn, &check(&thief).unwrap(), 4)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("already recorded on node n1"), "{e}");
        // Quarantine outlives a re-registration.
        nodes::set_state(&conn, &id, nodes::NODE_QUARANTINED, "failed a check", 5).unwrap();
        admitted(&mut conn, &with_secret(&reg, &secret), 6).unwrap();
        assert_eq!(
            nodes::get(&conn, &id).unwrap().unwrap().state,
            nodes::NODE_QUARANTINED
        );
    }

    #[test]
    fn a_name_is_bound_to_the_host_that_first_took_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = crate::store::open(&dir.path().join("s.db")).unwrap();
        let reg = registration("n1", &["GPU-a"]);
        let secret = admitted(&mut conn, &check(&reg).unwrap(), 1)
            .unwrap()
            .issued_secret
            .unwrap();
        // Its GPU UUIDs are no proof: without the secret, or with another, refused.
        for wrong in ["", "gfn_guess"] {
            let e = admitted(&mut conn, &with_secret(&reg, wrong), 2)
                .err()
                .unwrap();
            assert!(matches!(e, Refusal::Impostor(_)), "{e}");
            assert!(e.to_string().contains("node-forget-secret n1"), "{e}");
        }
        assert!(admitted(&mut conn, &with_secret(&reg, &secret), 3).is_ok());
        // A node from before secrets (none recorded) is issued one at its next registration.
        nodes::set_secret_hash(&conn, "n1", "").unwrap();
        let issued = admitted(&mut conn, &check(&reg).unwrap(), 4)
            .unwrap()
            .issued_secret;
        assert!(issued.is_some_and(|s| s != secret));
    }

    #[test]
    fn bad_registrations_are_refused_naming_the_field() {
        let mut reg = registration("N1", &["GPU-a"]);
        assert!(check(&reg).err().unwrap().to_string().starts_with("name"));
        reg.name = "n1".into();
        reg.capacity = "spot".into();
        assert!(check(&reg)
            .err()
            .unwrap()
            .to_string()
            .starts_with("capacity"));
        let dup = registration("n1", &["GPU-a", "GPU-a"]);
        assert!(check(&dup).err().unwrap().to_string().contains("repeated"));
        let none = registration("n1", &[]);
        assert!(check(&none).err().unwrap().to_string().contains("1 to 64"));
    }

    #[test]
    fn an_agent_of_a_protocol_too_far_from_ours_is_refused_naming_both_versions() {
        let mut reg = registration("n1", &["GPU-a"]);
        assert_eq!(check(&reg).unwrap().version, Version::ours());
        // The previous release sends no version: protocol 1, accepted.
        reg.release.clear();
        reg.protocol = None;
        assert_eq!(check(&reg).unwrap().version.protocol, 1);
        reg.release = "9.0.0".into();
        reg.protocol = Some(4);
        let refused = check(&reg).err().unwrap();
        assert!(matches!(refused, Refusal::Unsupported(_)));
        let why = refused.to_string();
        let ours = format!(
            "control plane is release {} speaking protocol 2",
            gpufleet_wire::protocol_version::RELEASE
        );
        assert!(why.starts_with("protocol: this agent is release 9.0.0 speaking protocol 4"));
        assert!(
            why.contains(&ours) && why.contains("upgrade the control plane"),
            "{why}"
        );
        reg.protocol = Some(0);
        let why = check(&reg).err().unwrap().to_string();
        assert!(why.contains("upgrade the agent"), "{why}");
        reg.release = "9.0.0; rm".into();
        assert!(check(&reg)
            .err()
            .unwrap()
            .to_string()
            .starts_with("release:"));
    }

    #[test]
    fn hardware_and_the_bandwidth_address_are_bounded_naming_the_field() {
        let reg = registration("n1", &["GPU-a"]);
        let with = |f: &dyn Fn(&mut v1::RegisterNode)| {
            let mut r = reg.clone();
            f(&mut r);
            check(&r).map(|_| ()).map_err(|e| e.to_string())
        };
        let e = with(&|r| r.hardware = "quantum".into()).unwrap_err();
        assert!(e.starts_with("hardware: one of sim, nvml"), "{e}");
        assert!(with(&|r| r.hardware = "nvml".into()).is_ok());
        for good in ["", "10.0.0.7:7701", "[fd00::7]:7701", "gpu-7.lab:7701"] {
            assert!(with(&|r| r.bandwidth_addr = good.into()).is_ok(), "{good}");
        }
        for bad in [
            &"a".repeat(5000),
            "10.0.0.7",
            "10.0.0.7:0",
            "10.0.0.7:70000",
            "gpu 7:7701",
            "-gpu:7701",
            ":7701",
        ] {
            let e = with(&|r| r.bandwidth_addr = bad.into()).unwrap_err();
            assert!(e.starts_with("bandwidth_addr: "), "{bad}: {e}");
            assert!(e.len() < 200, "the refusal quotes a bounded part: {e}");
        }
    }

    #[test]
    fn a_hosts_isolation_problem_is_bounded_and_kept_inert() {
        let mut reg = registration("n1", &["GPU-a"]);
        assert_eq!(check(&reg).unwrap().isolation_problem, "");
        reg.isolation_problem = "cgroup v1 controller 'memory'\nDeleteTenant OK\u{1b}[2J".into();
        let kept = check(&reg).unwrap().isolation_problem;
        assert!(kept.starts_with("cgroup v1 controller 'memory'"), "{kept}");
        assert!(!kept.chars().any(char::is_control), "{kept:?}");
        reg.isolation_problem = "é".repeat(MAX_ISOLATION_PROBLEM);
        assert!(check(&reg).is_ok(), "counted in characters");
        reg.isolation_problem.push('x');
        let e = check(&reg).map(|_| ()).unwrap_err().to_string();
        assert!(
            e.starts_with("isolation_problem: at most 1024 characters"),
            "{e}"
        );
    }

    #[test]
    fn a_nodes_slurm_host_is_bounded_and_defaults_to_loopback() {
        let reg = registration("n1", &["GPU-a"]);
        assert_eq!(
            check(&reg).unwrap().host,
            nodes::NodeHost {
                address: "127.0.0.1".into(),
                hostname: "localhost".into(),
                cpus: 1,
                memory_mib: 0,
                simulated: true,
            }
        );
        let mut good = reg.clone();
        (good.slurm_address, good.slurm_hostname) = ("10.0.0.7".into(), "gpu-7.lab".into());
        (good.cpus, good.memory_mib) = (96, 1_048_576);
        let host = check(&good).unwrap().host;
        assert_eq!((host.address.as_str(), host.cpus), ("10.0.0.7", 96));
        let refused = |f: &dyn Fn(&mut v1::RegisterNode)| {
            let mut r = reg.clone();
            f(&mut r);
            check(&r).err().unwrap().to_string()
        };
        for a in ["0.0.0.0", "::1", "gpu-7", "10.0.0.7:6818", &"1".repeat(300)] {
            let e = refused(&|r| r.slurm_address = a.into());
            assert!(e.starts_with("slurm_address: "), "{e}");
        }
        for h in ["a b", "-x", &"h".repeat(65), "h\n"] {
            let e = refused(&|r| r.slurm_hostname = h.into());
            assert!(e.starts_with("slurm_hostname: "), "{e}");
        }
        let e = refused(&|r| r.cpus = 65_537);
        assert!(e.starts_with("cpus: 1 to 65536"), "{e}");
        let e = refused(&|r| r.memory_mib = u64::MAX);
        assert!(e.starts_with("memory_mib: at most"), "{e}");
    }
}
