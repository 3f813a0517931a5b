//! The lifecycle of a Slurm tenant cluster, between the store and the node agents, which
//! run every daemon of the cluster on the cluster's own nodes: bring it up (or to its new
//! nodes and layout) after the MIG changes converged, take it down on delete, watch what
//! Slurm says about its nodes for the cluster's status, and bring its nodes back to it
//! after a restart of the control plane or of an agent. The control plane runs no
//! process of any team: no controller, no login, no munged.
//!
//! **Where things run.** Each node's agent runs the node's slurmd; the cluster's head node
//! also runs the primary `slurmctld` and the login `sshd`, and, when the controllers can
//! share a state directory, a second node runs a backup `slurmctld` (slurm.conf's
//! `SlurmctldHost` twice: Slurm's own failover). Which nodes, and why they stay or move:
//! [`placement`]. One `StartSlurmd` order per node says all a node runs for the cluster.
//!
//! **State.** With the platform's shared storage and external agents (team volumes
//! mounted on the nodes), the controllers' `StateSaveLocation` is
//! `<shared storage>/.slurm/<cluster>/` (root's, 0700): beside the team volumes, not in
//! one, because the volume's root belongs to the team, which could swap a directory there
//! for one of its own, and slurmctld trusts its state (a job's record names the uid its
//! job runs as). Both controllers and any later head read the same state, so queued and
//! running jobs survive a head that moves. The team's home is its volume (each node's
//! `/run/gpufleet/<cluster>/home` links to `storage_path`). Without shared storage the
//! state is under the head agent's data dir: it survives the agent's and the control
//! plane's restarts, not a move of the head (the new head starts with an empty queue), and
//! there is no backup.
//!
//! **Endpoint.** The login is reached at the head node's declared address (its agent's
//! `--address`, as slurmd is): `endpoint` and `credentials` (`host`, `login`,
//! `known_hosts`) name it and follow the head when it moves (written again at every
//! bring-up). The login's host key is the cluster's, kept in the store and handed to
//! whichever node runs the login, so the key a team's `known_hosts` holds stays the same.
//! Each node is declared as its agent last registered its host (`store::nodes::host`:
//! NodeAddr, NodeHostname, CPUs, RealMemory).
//!
//! **Watching.** The controller is asked through the cluster's agents ([`queries`]): a
//! status every few seconds, drains and resumes. A control plane that stops (even
//! `kill -9`) stops nothing of a cluster: its daemons are the agents'. When it starts
//! again, each cluster is brought to its nodes once (idempotent: daemons that run the same
//! configuration are left alone).
//!
//! Changes that would end running jobs drain the nodes in Slurm first and wait for their
//! jobs: a driver roll (`scheduling::drivers`), a scale-down and a layout change
//! (`services::clusters`, through [`drain_nodes`] and [`apply_resuming`]).

mod placement;
mod queries;
mod state_dirs;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpufleet_proto::v1;
use gpufleet_slurm::PortRange;
use gpufleet_sql::AsConn;
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::lease::Fence;
use crate::registry::Outcome;
use crate::slurm_tracker::Tracked;
use crate::state::AppState;
use crate::store::slurm_access::SlurmAccess;
use crate::store::{self, clusters::ClusterRow, nodes::NodeRow};
use gpufleet_slurm::account::{self, Account};
use gpufleet_slurm::{conf, login, munge, status};

/// How long a bring-up waits for every node to be schedulable before it reports the
/// cluster degraded (with the Slurm states) instead of running.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// How often the supervisor looks at the clusters and their nodes.
const WATCH_EVERY: Duration = Duration::from_secs(2);
/// How long a cluster whose acceptance probe failed waits before it is probed again.
const PROBE_AGAIN: Duration = Duration::from_secs(30);
/// How long the jobs of nodes set down (before they leave a cluster) are waited for to
/// end on the cluster's other nodes (a few seconds: their slurmd end them at once).
const ENDED_WITHIN: Duration = Duration::from_secs(30);
/// How often a wait asks the controller again.
const ASK_EVERY: Duration = Duration::from_millis(250);

pub fn is_slurm(c: &ClusterRow) -> bool {
    c.orchestrator == "slurm"
}

/// Refuses a Slurm cluster, rather than pretending, where this host runs the nodes
/// (embedded node agents) and lacks Slurm, munge or sshd, or cannot make the cluster's
/// account. External agents check their own hosts when they start the daemons (the apply
/// fails naming the node and what it lacks).
pub fn require(state: &AppState, orchestrator: &str) -> Result<()> {
    if orchestrator != "slurm" || state.slurm.external_nodes() {
        return Ok(());
    }
    refuse_without(&gpufleet_slurm::missing())?;
    refuse_without_cgroups(Path::new(gpufleet_slurm::CGROUP_ROOT))?;
    // SAFETY: geteuid only reads the process's credentials.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Error::Precondition(
            "orchestrator: \"slurm\" gives each cluster an account of its own on its nodes' hosts, and with embedded node agents that is this host, which needs the control plane to run as root".into(),
        ));
    }
    Ok(())
}

/// A team's ssh keys for a cluster: only a Slurm cluster has a login, and each key must be
/// an OpenSSH public key.
pub fn check_ssh_public_keys(orchestrator: &str, keys: &[String]) -> Result<()> {
    if orchestrator != "slurm" {
        if keys.is_empty() {
            return Ok(());
        }
        return Err(Error::Invalid(format!(
            "ssh_public_keys: only a Slurm cluster has a login endpoint (orchestrator is \"{orchestrator}\")"
        )));
    }
    login::check_public_keys(keys).map_err(Error::Invalid)
}

/// The refusal when `missing` programs are absent (none: no refusal).
fn refuse_without(missing: &[&str]) -> Result<()> {
    if missing.is_empty() {
        return Ok(());
    }
    Err(Error::Precondition(format!(
        "orchestrator: \"slurm\" runs real Slurm daemons on the cluster's nodes, which with embedded node agents are this host, and {} {} missing here; install Debian's slurm-wlm, munge and openssh-server (scripts/bootstrap.sh does)",
        missing.join(", "),
        if missing.len() == 1 { "is" } else { "are" }
    )))
}

/// The refusal when this host (the embedded nodes') lacks a cgroup v1 controller Slurm
/// needs under `root`: said at the plan, not as slurmd's "initialization failed".
fn refuse_without_cgroups(root: &Path) -> Result<()> {
    match gpufleet_slurm::cgroup_controllers_problem(root) {
        None => Ok(()),
        Some(why) => Err(Error::Precondition(format!(
            "orchestrator: \"slurm\" runs real Slurm daemons on the cluster's nodes, which with embedded node agents are this host, and on it {why}"
        ))),
    }
}

/// The account's home on every host of the cluster (its user database's).
fn home_of(cluster: &str) -> PathBuf {
    account::runtime_dir(cluster).join(account::HOME)
}

/// What the team is given: how to log in, and how to check the login's host key. Nothing
/// in it grants more than a session as the cluster's own account.
fn credentials(p: &Plan, head: &Head) -> String {
    let (host, port, user) = (&head.host.address, p.access.login_port, &p.account.name);
    serde_json::json!({
        "cluster": p.name,
        "user": user,
        "host": host,
        "port": port,
        "login": format!("ssh -p {port} {user}@{host}"),
        "known_hosts": login::known_hosts_line(host, port, &p.host_key.public),
        "home": home_of(&p.name).display().to_string(),
        "login_node": head.node.hostname,
    })
    .to_string()
}

/// A new Slurm cluster's access: a munge key and a login host key of its own, and free
/// ports for its controllers and its login. Record it with [`record`] once the cluster is
/// stored.
pub struct NewAccess {
    munge_key: String,
    host_key: login::HostKey,
}

/// A new Slurm cluster's access; its `endpoint` is its login's once its head node runs it.
pub fn prepare(c: &mut ClusterRow) -> Result<Option<NewAccess>> {
    if !is_slurm(c) {
        return Ok(None);
    }
    c.endpoint = String::new();
    c.credentials = String::new();
    Ok(Some(NewAccess {
        munge_key: munge::encode(&munge::new_key()),
        host_key: login::new_host_key().map_err(Error::Internal)?,
    }))
}

/// How many candidate uids a new cluster tries before it is refused.
const UID_ATTEMPTS: u32 = 64;

/// A port of the platform's Slurm range (`serve --slurm-ports`) that none of its Slurm
/// clusters has and that is free on this host (the daemons of several clusters share a
/// host with embedded nodes, and control planes of tests share a machine): tried at
/// random, so two control planes rarely try the same one. Ports a cluster got from an
/// earlier range are kept: only new ones come from this range.
fn new_port(range: PortRange, taken: &mut BTreeSet<u16>) -> Result<u16> {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    for _ in 0..256 {
        let p = rng.gen_range(range.low()..=range.high());
        if !taken.contains(&p) && gpufleet_slurm::port_free(p) {
            taken.insert(p);
            return Ok(p);
        }
    }
    Err(Error::Precondition(format!(
        "no free port in the Slurm range {range} after 256 tries: the platform's Slurm clusters and this host's other listeners hold them (widen it with serve --slurm-ports)"
    )))
}

/// Stores a new cluster's access with the team's keys, its ports and its account's uid:
/// the first candidate no other cluster has. (A host where a user or group already has it
/// refuses the bring-up naming both; the candidates are spread over 100 million uids, so
/// two control planes sharing a host rarely meet. No host lookup runs here, on the writer.)
pub fn record(
    conn: &impl AsConn,
    cluster_id: &str,
    new: NewAccess,
    ssh_public_keys: &[String],
    ports: PortRange,
) -> Result<()> {
    let mut uid = None;
    for attempt in 0..UID_ATTEMPTS {
        let candidate = Account::candidate_uid(cluster_id, attempt);
        if !store::slurm_access::uid_taken(conn, candidate)? {
            uid = Some(candidate);
            break;
        }
    }
    let uid = uid.ok_or_else(|| {
        Error::Precondition(format!(
            "orchestrator: no free uid for the cluster's account after {UID_ATTEMPTS} tries"
        ))
    })?;
    let mut taken = store::slurm_access::ports_taken(conn)?;
    let controller_port = new_port(ports, &mut taken)?;
    let login_port = new_port(ports, &mut taken)?;
    store::slurm_access::insert(
        conn,
        &SlurmAccess {
            cluster_id: cluster_id.to_string(),
            munge_key: new.munge_key,
            uid,
            controller_port,
            login_port,
            ssh_public_keys: ssh_public_keys.to_vec(),
            login_host_key: new.host_key.private,
            login_host_public: new.host_key.public,
            ..SlurmAccess::default()
        },
    )?;
    Ok(())
}

fn access_of(conn: &impl AsConn, c: &ClusterRow) -> Result<SlurmAccess> {
    store::slurm_access::get(conn, &c.id)?.ok_or_else(|| {
        Error::Internal(format!(
            "cluster {}: its Slurm access is not recorded",
            c.name
        ))
    })
}

/// The login's `host:port` as the cluster's `endpoint` gives it.
fn endpoint(host: &str, login_port: u16) -> String {
    format!("{host}:{login_port}")
}

/// A node of the cluster with its host as its agent declared it.
#[derive(Clone, Debug)]
struct Head {
    node: NodeRow,
    host: store::nodes::NodeHost,
}

/// What the cluster's Slurm should be now, from the store.
struct Plan {
    cluster: ClusterRow,
    access: SlurmAccess,
    /// Slurm's ClusterName, the account's name.
    name: String,
    account: Account,
    key: Vec<u8>,
    /// Its nodes, by name.
    nodes: Vec<NodeRow>,
    /// Each node's slurmd port.
    ports: BTreeMap<String, u16>,
    head: Option<Head>,
    backup: Option<Head>,
    /// slurm.conf as every party shares it.
    shared_conf: String,
    /// The controllers' state directory on the shared storage (the head's own,
    /// `state_dirs`); '' under the head's agent.
    state_dir: String,
    /// Where a new state directory is copied from: the state directories before.
    seed_from: Vec<String>,
    /// The head's controller's FirstJobId: on a move, past every id a controller of the
    /// cluster gave (see [`first_job_id`]); else the one it runs with.
    first_job_id: u64,
    /// The team volume's mount path on the nodes, which the home links to; '' none.
    home: String,
    /// The team volume's mount path on the nodes (shared or node-local), the only one
    /// the cluster's namespaces show; '' when volumes are not mounted on nodes.
    volume: String,
    host_key: login::HostKey,
    /// Made now (a cluster from before host keys were kept): to record.
    new_host_key: bool,
    /// Nodes that ran something of the cluster and are not in it any more.
    gone: Vec<NodeRow>,
}

impl Plan {
    /// Everything the nodes are ordered to run, in one string: equal when nothing changed.
    fn fingerprint(&self) -> String {
        let id = |h: &Option<Head>| h.as_ref().map(|h| h.node.id.clone()).unwrap_or_default();
        format!(
            "{}\u{0}{}\u{0}{}\u{0}{}\u{0}{}\u{0}{}\u{0}{}\u{0}{}\u{0}{:?}\u{0}{}\u{0}{}\u{0}{}\u{0}{}",
            self.shared_conf,
            id(&self.head),
            id(&self.backup),
            self.state_dir,
            self.home,
            self.volume,
            self.access.login_port,
            self.access.uid,
            self.access.ssh_public_keys,
            self.host_key.public,
            self.access.munge_key,
            self.nodes
                .iter()
                .map(|n| n.id.as_str())
                .collect::<Vec<_>>()
                .join(","),
            self.first_job_id,
        )
    }

    /// The node's order: its slurmd, and its controller and login if it is the head or
    /// the backup.
    fn order(&self, node: &NodeRow) -> v1::WorkOrder {
        let head = self.head.as_ref().is_some_and(|h| h.node.id == node.id);
        let backup = self.backup.as_ref().is_some_and(|b| b.node.id == node.id);
        v1::WorkOrder {
            id: uuid::Uuid::new_v4().to_string(),
            epoch: 0, // stamped by Registry::dispatch
            kind: Some(v1::work_order::Kind::StartSlurmd(v1::StartSlurmd {
                cluster: self.name.clone(),
                slurm_conf: self.shared_conf.clone(),
                cgroup_conf: conf::cgroup(),
                munge_key: self.key.clone(),
                uid: self.account.uid,
                home: self.home.clone(),
                volume: self.volume.clone(),
                controller: (head || backup).then(|| v1::SlurmController {
                    backup,
                    state_dir: self.state_dir.clone(),
                    seed_from: self.seed_from.clone(),
                    first_job_id: self.first_job_id,
                }),
                login: head.then(|| v1::SlurmLogin {
                    port: u32::from(self.access.login_port),
                    ssh_public_keys: self.access.ssh_public_keys.clone(),
                    host_key: self.host_key.private.clone(),
                }),
            })),
        }
    }

    /// The nodes to ask the controller through: the head, the backup, then the others.
    fn askable(&self) -> Vec<NodeRow> {
        let mut out: Vec<NodeRow> = self
            .head
            .iter()
            .chain(&self.backup)
            .map(|h| h.node.clone())
            .collect();
        for n in &self.nodes {
            if !out.iter().any(|o| o.id == n.id) {
                out.push(n.clone());
            }
        }
        out
    }
}

/// The host a node declared, or (a node that has not registered since hosts were
/// recorded) this host's loopback with 1 CPU.
fn host_of(conn: &impl AsConn, node: &NodeRow) -> Result<store::nodes::NodeHost> {
    Ok(
        store::nodes::host(conn, &node.id)?.unwrap_or_else(|| store::nodes::NodeHost {
            address: "127.0.0.1".into(),
            hostname: "localhost".into(),
            cpus: 1,
            memory_mib: 0,
            simulated: false,
        }),
    )
}

/// The login host key a cluster from before kept keys had on the control plane's host
/// (`<data-dir>/slurm/<cluster>/`), so that its team's known_hosts stays valid.
fn legacy_host_key(state: &AppState, name: &str) -> Option<login::HostKey> {
    let files = login::Files::in_dir(&state.data_dir.join("slurm").join(name));
    let private = std::fs::read_to_string(&files.host_key).ok()?;
    let public = std::fs::read_to_string(files.host_key.with_extension("pub")).ok()?;
    Some(login::HostKey {
        private,
        public: public
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" "),
    })
}

/// The ids a controller of the cluster may have given after the control plane last read its
/// next job id (it reads it at each look at the cluster): a new controller starts past them.
const JOB_ID_MARGIN: u64 = 10_000;

/// A new head's FirstJobId, given the greatest next job id a controller of the cluster
/// reported (0: none was read yet, as when the head is lost within seconds of the
/// cluster's start): past it and the ids given since, within Slurm's bound.
fn first_job_id(next_seen: u64) -> u64 {
    next_seen
        .max(1)
        .saturating_add(JOB_ID_MARGIN)
        .min(conf::MAX_FIRST_JOB_ID)
}

fn plan(state: &AppState, conn: &impl AsConn, cluster_id: &str) -> Result<Option<Plan>> {
    let Some(c) = store::clusters::get(conn, cluster_id)? else {
        return Ok(None);
    };
    if !is_slurm(&c) {
        return Ok(None);
    }
    let access = access_of(conn, &c)?;
    let name = gpufleet_slurm::cluster_name(&c.id);
    let mut nodes = store::nodes::list(conn, None, Some(&c.id))?;
    nodes.sort_by(|a, b| a.hostname.cmp(&b.hostname));
    let hosts = nodes
        .iter()
        .map(|n| host_of(conn, n))
        .collect::<Result<Vec<_>>>()?;
    // A node keeps its slurmd port across changes; new nodes get free ones.
    let mut taken = store::slurm_access::ports_taken(conn)?;
    let mut ports = BTreeMap::new();
    for n in &nodes {
        let port = match access.node_ports.get(&n.hostname) {
            Some(p) => *p,
            None => new_port(state.slurm_ports, &mut taken)?,
        };
        ports.insert(n.hostname.clone(), port);
    }
    let shared_state = state.volumes.shared_on_nodes();
    let candidates: Vec<placement::Candidate> = nodes
        .iter()
        .zip(&hosts)
        .map(|(n, h)| placement::Candidate {
            id: &n.id,
            name: &n.hostname,
            host: &h.hostname,
        })
        .collect();
    let placed = placement::place(
        &candidates,
        &access.head_node,
        &access.backup_node,
        shared_state,
    );
    let at = |i: usize| Head {
        node: nodes[i].clone(),
        host: hosts[i].clone(),
    };
    let head = placed.map(|p| at(p.head));
    let backup = placed.and_then(|p| p.backup).map(at);
    let mut conf_nodes = Vec::new();
    for (n, host) in nodes.iter().zip(&hosts) {
        let gpus = crate::recorded::recorded_gpus(conn, &n.id)?.len() as u32;
        conf_nodes.push(conf::Node {
            name: n.hostname.clone(),
            host: host.hostname.clone(),
            addr: host.address.clone(),
            port: ports[&n.hostname],
            cpus: host.cpus,
            memory_mib: host.memory_mib,
            gres: conf::node_gres(&c.gpu_type, gpus, &c.mig_layout),
            simulated: host.simulated,
        });
    }
    let controller = conf::Controller {
        cluster: name.clone(),
        port: access.controller_port,
        hosts: head
            .iter()
            .chain(&backup)
            .map(|h| conf::ControllerHost {
                hostname: h.host.hostname.clone(),
                addr: h.host.address.clone(),
            })
            .collect(),
    };
    let shared_conf = conf::shared(&controller, &conf_nodes, &gpufleet_slurm::current_user());
    let (host_key, new_host_key) = match access.login_host_key.is_empty() {
        false => (
            login::HostKey {
                private: access.login_host_key.clone(),
                public: access.login_host_public.clone(),
            },
            false,
        ),
        true => match legacy_host_key(state, &name) {
            Some(k) => (k, true),
            None => (login::new_host_key().map_err(Error::Internal)?, true),
        },
    };
    // What ran something of the cluster before and is not in it now: the recorded head
    // and backup, and every node its slurm.conf declared.
    let mut gone: Vec<NodeRow> = Vec::new();
    let member = |id: &str| nodes.iter().any(|n| n.id == id);
    for id in [&access.head_node, &access.backup_node] {
        if !id.is_empty() && !member(id) {
            if let Some(n) = store::nodes::get(conn, id)? {
                gone.push(n);
            }
        }
    }
    for name in access.node_ports.keys() {
        if nodes.iter().any(|n| &n.hostname == name) {
            continue;
        }
        if let Some(n) = store::nodes::by_hostname(conn, name)? {
            if !gone.iter().any(|g| g.id == n.id) && n.cluster_id.as_deref() != Some(&c.id) {
                gone.push(n);
            }
        }
    }
    let key = munge::decode(&access.munge_key)
        .map_err(|e| Error::Internal(format!("cluster {}: {e}", c.name)))?;
    let (state_dir, seed_from) = match (&head, shared_state) {
        (Some(h), true) => {
            let root = state.volumes.root();
            (
                state_dirs::current(root, &name, &access.head_node, &h.node.id)
                    .display()
                    .to_string(),
                state_dirs::seeds(root, &name, &access.head_node, &h.node.id)
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect(),
            )
        }
        _ => (String::new(), Vec::new()),
    };
    let first_job_id = match &head {
        Some(h) if !access.head_node.is_empty() && access.head_node != h.node.id => {
            first_job_id(access.next_job_id)
        }
        _ => access.first_job_id,
    };
    Ok(Some(Plan {
        account: Account::new(&name, access.uid).map_err(Error::Internal)?,
        state_dir,
        seed_from,
        first_job_id,
        home: match state.volumes.shared_on_nodes() {
            true => c.storage_path.clone(),
            false => String::new(),
        },
        volume: match state.volumes.mounts_on_nodes() {
            true => c.storage_path.clone(),
            false => String::new(),
        },
        key,
        name,
        nodes,
        ports,
        head,
        backup,
        shared_conf,
        host_key,
        new_host_key,
        gone,
        access,
        cluster: c,
    }))
}

async fn read_plan(state: &Arc<AppState>, cluster_id: &str) -> Result<Option<Plan>> {
    let (planner, id) = (state.clone(), cluster_id.to_string());
    state.read(move |conn| plan(&planner, conn, &id)).await
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::Internal(format!("a Slurm worker failed: {e}")))?
}

fn stop_order(cluster: &str) -> v1::WorkOrder {
    v1::WorkOrder {
        id: uuid::Uuid::new_v4().to_string(),
        epoch: 0, // stamped by Registry::dispatch
        kind: Some(v1::work_order::Kind::StopSlurmd(v1::StopSlurmd {
            cluster: cluster.to_string(),
        })),
    }
}

/// Sends `order` (a fresh one per node) to every node and gathers the failures.
async fn order_all(
    state: &AppState,
    nodes: &[NodeRow],
    order: impl Fn(&NodeRow) -> v1::WorkOrder,
) -> Vec<String> {
    let (mut failed, unreachable) = order_each(state, nodes, order).await;
    failed.extend(unreachable);
    failed
}

/// Sends `order` (a fresh one per node) to every node: (the failures its agents answered,
/// the nodes that could not be reached).
async fn order_each(
    state: &AppState,
    nodes: &[NodeRow],
    order: impl Fn(&NodeRow) -> v1::WorkOrder,
) -> (Vec<String>, Vec<String>) {
    let waits: Vec<_> = nodes
        .iter()
        .map(|n| (n, state.agents.dispatch(&n.id, order(n))))
        .collect();
    let (mut failed, mut unreachable) = (Vec::new(), Vec::new());
    for (n, wait) in waits {
        match wait.await {
            Ok(Outcome::Answered(r)) if r.ok => {}
            Ok(Outcome::Answered(r)) => failed.push(format!("{}: {}", n.hostname, r.error)),
            Ok(Outcome::Unreachable(why)) => unreachable.push(format!("{}: {why}", n.hostname)),
            Err(_) => failed.push(format!("{}: the control plane is stopping", n.hostname)),
        }
    }
    (failed, unreachable)
}

/// Brings a Slurm cluster to its nodes and layout in the store (after the MIG changes
/// converged): every node's daemons as its order says (the controller and login on the
/// head, the backup controller on its node, slurmd on every node), everything of the
/// cluster stopped on `released` nodes and on nodes that left it, the team's endpoint and
/// credentials written. Returns why the cluster is not ready yet (the Slurm state of each
/// node that is not), if it is not within a bounded wait. Nothing for a Kubernetes
/// cluster.
pub async fn apply(
    state: &Arc<AppState>,
    cluster_id: &str,
    released: &[NodeRow],
) -> Result<Option<String>> {
    apply_resuming(state, cluster_id, released, &[]).await
}

/// Like [`apply`], and returns the `drained` nodes (drained for this change, see
/// [`drain_nodes`]) to service once their slurmd run the new configuration, before the
/// wait for every node to be schedulable.
pub async fn apply_resuming(
    state: &Arc<AppState>,
    cluster_id: &str,
    released: &[NodeRow],
    drained: &[NodeRow],
) -> Result<Option<String>> {
    let tracked = state.slurm.of(cluster_id);
    let _one = tracked.bring_up.lock().await;
    // A request's (a create, an update, a refill's change): not fenced.
    let fence = Fence::request();
    if let Some(why) = bring_up(
        state,
        (&fence, By::Request),
        &tracked,
        cluster_id,
        released,
        drained,
    )
    .await?
    {
        return Ok(Some(why));
    }
    let why = accept(state, cluster_id).await;
    tracked.set_unaccepted(why.clone());
    Ok(why)
}

/// What makes a Slurm cluster usable, checked before a create or an update calls it
/// `running` (its acceptance, with the health checks of its `acceptance` block): the
/// controller answers through every node (each reaches it), a job step runs on every node
/// at once as the cluster's account (the controller reaches each slurmd, and each starts
/// it), and the login answers. Some(why not). A node whose every core runs the team's own
/// jobs is not probed (it works).
async fn accept(state: &Arc<AppState>, cluster_id: &str) -> Option<String> {
    let id = cluster_id.to_string();
    let c = match state
        .read(move |conn| Ok::<_, Error>(store::clusters::get(conn, &id)?))
        .await
    {
        Ok(Some(c)) if is_slurm(&c) => c,
        Ok(_) => return None,
        Err(e) => return Some(format!("Slurm: {e}")),
    };
    let nodes = match askable(state, &c).await {
        Ok(n) if !n.is_empty() => n,
        Ok(_) => return Some("Slurm: the cluster has no node".into()),
        Err(e) => return Some(format!("Slurm: {e}")),
    };
    let name = gpufleet_slurm::cluster_name(&c.id);
    for n in &nodes {
        let one = std::slice::from_ref(n);
        if let Err(e) = queries::ask(state, &name, one, "status", &[], "").await {
            return Some(format!(
                "Slurm: the controller does not answer from node {}: {e}",
                n.hostname
            ));
        }
    }
    let names: Vec<String> = nodes.iter().map(|n| n.hostname.clone()).collect();
    match queries::ask(state, &name, &nodes[..1], "probe", &names, "").await {
        Ok(said) => {
            if said.probe != "ran" {
                tracing::info!(cluster = %c.name, probe = %said.probe, "the Slurm cluster's probe did not run on every node");
            }
            None
        }
        Err(e) => Some(format!("Slurm: not usable: {e}")),
    }
}

/// Who brings a cluster up: a request (a create's, an update's, a registration's), or
/// the supervisor, which leaves a cluster a request is changing to that request.
#[derive(Clone, Copy, PartialEq)]
enum By {
    Request,
    Supervisor,
}

/// [`apply_resuming`] with the cluster's bring-up lock held. `fence`: the supervisor's
/// (a singleton) records nothing of the placement once its replica lost the lease.
async fn bring_up(
    state: &Arc<AppState>,
    (fence, by): (&Fence, By),
    tracked: &Tracked,
    cluster_id: &str,
    released: &[NodeRow],
    drained: &[NodeRow],
) -> Result<Option<String>> {
    let Some(mut plan) = read_plan(state, cluster_id).await? else {
        tracked.set_applied(None);
        return Ok(None);
    };
    // The supervisor found the cluster settled, but a request may have changed it since:
    // its row already holds the new layout while the nodes still have the old one, and
    // Slurm given the new one now would refuse the nodes ("inval") while the request
    // waits for them to drain. The request brings it up once the nodes have it.
    if by == By::Supervisor && !matches!(plan.cluster.status.as_str(), "running" | "degraded") {
        return Ok(None);
    }
    tracked.set_applied(None);
    if plan.access.login_port == 0 {
        plan.access.login_port = give_login_port(state, fence, &plan.cluster.id).await?;
    }
    if plan.new_host_key {
        let (id, key, f) = (
            plan.cluster.id.clone(),
            plan.host_key.clone(),
            fence.clone(),
        );
        state
            .apply(move |conn| -> Result<()> {
                f.check(conn)?;
                Ok(store::slurm_access::set_login_host_key(
                    conn,
                    &id,
                    &key.private,
                    &key.public,
                )?)
            })
            .await?;
    }
    let name = plan.name.clone();
    // Everything of the cluster stops first on nodes that left it (a head that was
    // quarantined or replaced included), so that no controller of the old placement
    // runs beside the new one.
    let mut leaving: Vec<NodeRow> = released.to_vec();
    for g in &plan.gone {
        if !leaving.iter().any(|l| l.id == g.id) {
            leaving.push(g.clone());
        }
    }
    fail_leaving(state, &plan, &leaving).await;
    for f in order_all(state, &leaving, |_| stop_order(&name)).await {
        tracing::warn!(cluster = %plan.cluster.name, failure = %f, "cannot stop the cluster's daemons on a node that left it");
    }
    // The team volume on every node of the cluster (and on none that left it) before
    // anything runs there: the account's home is the volume. Declarative; most changes of
    // membership have done it already, a replacement after a failed check has not.
    let volumes: Vec<String> = plan
        .nodes
        .iter()
        .chain(&leaving)
        .map(|n| n.id.clone())
        .collect();
    if let Err(e) = crate::node_volumes::sync(state, volumes).await {
        tracing::warn!(cluster = %plan.cluster.name, error = %e, "the cluster's volume is not on all its nodes");
    }
    let Some(head) = plan.head.clone() else {
        return Ok(Some("Slurm: the cluster has no node".into()));
    };
    // Then the nodes that lose a controller or the login, then the head (the primary and
    // the login: the others' slurmd register with it), then every other node.
    let placed =
        |id: &str| head.node.id == id || plan.backup.as_ref().is_some_and(|b| b.node.id == id);
    let demoted: Vec<NodeRow> = plan
        .nodes
        .iter()
        .filter(|n| {
            (n.id == plan.access.head_node || n.id == plan.access.backup_node) && !placed(&n.id)
        })
        .cloned()
        .collect();
    // A node that cannot be reached gets its order when its agent registers again
    // (`rejoin`); meanwhile Slurm says what it is missing.
    let rest: Vec<NodeRow> = plan
        .nodes
        .iter()
        .filter(|n| n.id != head.node.id)
        .cloned()
        .collect();
    let mut unreachable = Vec::new();
    // Whether the head runs its order (its controller on its own state directory).
    let mut head_runs = false;
    let phases = [demoted.as_slice(), std::slice::from_ref(&head.node), &rest];
    for (i, phase) in phases.into_iter().enumerate() {
        let (failed, away) = order_each(state, phase, |n| plan.order(n)).await;
        head_runs |= i == 1 && failed.is_empty() && away.is_empty();
        unreachable.extend(away);
        if !failed.is_empty() {
            return Err(Error::Aborted(format!(
                "orchestrator: the cluster's Slurm daemons did not start on {}",
                failed.join("; ")
            )));
        }
    }
    for away in &unreachable {
        tracing::warn!(cluster = %plan.cluster.name, node = %away, "a node of the cluster cannot be reached; it gets its daemons when it registers again");
    }
    let moved = !plan.access.head_node.is_empty() && plan.access.head_node != head.node.id;
    {
        // Where the daemons run now, and the endpoint and credentials that follow the head.
        let (state2, id) = (state.clone(), plan.cluster.id.clone());
        let creds = credentials(&plan, &head);
        let endpoint = endpoint(&head.host.address, plan.access.login_port);
        let (head_id, backup_id) = (
            head.node.id.clone(),
            plan.backup
                .as_ref()
                .map(|b| b.node.id.clone())
                .unwrap_or_default(),
        );
        let (ports, first_job_id) = (plan.ports.clone(), plan.first_job_id);
        let f = fence.clone();
        state2
            .apply(move |conn| -> Result<()> {
                f.check(conn)?;
                store::slurm_access::set_placement(
                    conn,
                    &id,
                    &head_id,
                    &backup_id,
                    &ports,
                    first_job_id,
                )?;
                store::clusters::set_credentials(conn, &id, &creds)?;
                store::clusters::set_endpoint(conn, &id, &endpoint)?;
                Ok(())
            })
            .await?;
        plan.access.head_node = head.node.id.clone();
        plan.access.backup_node = plan
            .backup
            .as_ref()
            .map(|b| b.node.id.clone())
            .unwrap_or_default();
        plan.access.node_ports = plan.ports.clone();
        plan.access.first_job_id = plan.first_job_id;
    }
    if moved {
        tracing::info!(cluster = %plan.cluster.name, head = %head.node.hostname, address = %head.host.address, "the cluster's controller and login moved to another node");
    }
    if head_runs && !plan.state_dir.is_empty() {
        // The head's controller runs on its own state, seeded from the ones before: theirs
        // go (a cut-off former head's controller saving there reaches no one).
        let (root, name, keep) = (
            state.volumes.root().to_path_buf(),
            plan.name.clone(),
            PathBuf::from(&plan.state_dir),
        );
        let removed = blocking(move || {
            state_dirs::remove(&state_dirs::others(&root, &name, Some(&keep)))
                .map_err(Error::Internal)
        })
        .await;
        if let Err(e) = removed {
            tracing::warn!(cluster = %plan.cluster.name, error = %e, "cannot remove the state of the cluster's controllers before");
        }
    }
    tracked.set_applied(Some(plan.fingerprint()));
    let askable = plan.askable();
    let names: Vec<String> = drained.iter().map(|n| n.hostname.clone()).collect();
    if !names.is_empty() {
        // The controller kept their drain across its restart.
        if let Err(e) = queries::ask(state, &name, &askable, "resume", &names, "").await {
            tracing::warn!(cluster = %plan.cluster.name, error = %e, "cannot resume the drained Slurm nodes");
        }
    }
    let expected: Vec<String> = plan.nodes.iter().map(|n| n.hostname.clone()).collect();
    Ok(wait_ready(state, &name, &askable, expected).await)
}

/// Why a node that leaves a cluster is set down in its Slurm (what `sinfo -R` shows).
const LEAVING_REASON: &str = "gpufleet: the node leaves the cluster";

/// Sets DOWN in the cluster's Slurm, as on a node failure, the nodes of `leaving` that its
/// controller still has (the slurm.conf last written declares them), before the new node
/// set is written: the controller ends their job steps (each `srun` is told and ends with
/// an error) and requeues their batch jobs (Slurm's `JobRequeue=1`; not those submitted
/// with `--no-requeue`), which run again, same job id, `SLURM_RESTART_COUNT` one more, on
/// the nodes the cluster has then. It then waits (at most [`ENDED_WITHIN`]) until no job
/// is still ending, so that the controller restarts on jobs that are pending again (one
/// that recovers a job still ending on a node it no longer has requeues it a second time
/// and may never see it end). Without the down, a controller restarted on a node set
/// without them finds jobs on nodes it no longer has: Slurm 22.05 requeues those batch
/// jobs on its own, but the sruns of interactive steps are never told and wait on.
///
/// Asked through one node's agent: the first live of the nodes that run the controllers
/// now (the recorded head and backup, even when they are leaving), then the cluster's
/// other nodes; one, because a controller that does not answer takes each node's Slurm
/// commands their whole limit. Not asked when the head itself leaves out of reach (see
/// below). Best effort: a controller that does not answer is logged, and the cluster goes
/// ahead with its new node set.
async fn fail_leaving(state: &AppState, plan: &Plan, leaving: &[NodeRow]) {
    let names: Vec<String> = leaving
        .iter()
        .filter(|n| plan.access.node_ports.contains_key(&n.hostname))
        .map(|n| n.hostname.clone())
        .collect();
    if names.is_empty() {
        return;
    }
    // A head out of reach takes the primary controller and the login with it: its sruns
    // (the team's, on the login) are gone with them, and no controller answers until the
    // backup takes control (each node's Slurm commands would wait their whole limit for
    // it, delaying the move of the login). A head only cut off from the network runs its
    // primary on, and while it still reaches the shared storage its heartbeat there keeps
    // the backup standby: it sets down the nodes it cannot reach and requeues their jobs
    // in the shared state. The controller restarted with the new node set (on the backup's
    // node) recovers that state, and requeues the batch jobs it finds on a node it no
    // longer has (multihost_slurm_head_lost).
    let head = &plan.access.head_node;
    if leaving.iter().any(|n| &n.id == head) && !state.agents.is_live(head) {
        tracing::info!(cluster = %plan.cluster.name, nodes = ?names, "the cluster's head is out of reach: leaving nodes are not set down first");
        return;
    }
    let mut candidates: Vec<NodeRow> = [&plan.access.head_node, &plan.access.backup_node]
        .into_iter()
        .filter_map(|id| leaving.iter().find(|n| &n.id == id))
        .cloned()
        .collect();
    for n in plan.askable() {
        if !candidates.iter().any(|c| c.id == n.id) {
            candidates.push(n);
        }
    }
    let Some(through) = candidates.into_iter().find(|n| state.agents.is_live(&n.id)) else {
        return;
    };
    let through = std::slice::from_ref(&through);
    let cluster = &plan.cluster.name;
    // Setting down a node that is down already changes nothing but its reason.
    let mut said = match queries::ask(state, &plan.name, through, "down", &names, LEAVING_REASON)
        .await
    {
        Ok(said) => said,
        Err(e) => {
            tracing::warn!(%cluster, nodes = ?names, error = %e, "cannot set leaving nodes down in Slurm; their jobs are not requeued first");
            return;
        }
    };
    tracing::info!(%cluster, nodes = ?names, "set leaving nodes down in Slurm: their batch jobs are requeued");
    let deadline = Instant::now() + ENDED_WITHIN;
    loop {
        let ending = said.jobs.map_or(1, |j| j.ending);
        if ending == 0 {
            return;
        }
        if Instant::now() > deadline {
            tracing::warn!(%cluster, ending, "jobs of nodes set down are still ending; the cluster goes ahead with its new node set");
            return;
        }
        tokio::time::sleep(ASK_EVERY).await;
        said = match queries::ask(state, &plan.name, through, "status", &[], "").await {
            Ok(said) => said,
            Err(e) => {
                tracing::warn!(%cluster, error = %e, "the controller does not answer after leaving nodes were set down");
                return;
            }
        };
    }
}

/// A node of a Slurm cluster whose agent registered again (it restarted, or was cut off
/// and came back): its daemons get the cluster's configuration as it is now, not the one
/// its agent kept from before (a gres.conf of an old layout, a controller that moved).
/// When the node's host changed what the cluster runs (another address, CPUs or memory),
/// the whole cluster is brought to it; else only the node is.
pub async fn rejoin(state: &Arc<AppState>, node: &NodeRow) {
    let Some(cluster_id) = node.cluster_id.clone() else {
        return;
    };
    let tracked = state.slurm.of(&cluster_id);
    let _one = tracked.bring_up.lock().await;
    let plan = match read_plan(state, &cluster_id).await {
        Ok(Some(p)) if p.nodes.iter().any(|n| n.id == node.id) => p,
        Ok(_) => return,
        Err(e) => {
            tracing::warn!(node = %node.hostname, error = %e, "cannot plan the Slurm config of a node that came back");
            return;
        }
    };
    if tracked.applied() != Some(plan.fingerprint()) {
        // A registration's: not fenced.
        let fence = Fence::request();
        if let Err(e) = bring_up(
            state,
            (&fence, By::Request),
            &tracked,
            &cluster_id,
            &[],
            &[],
        )
        .await
        {
            tracing::warn!(cluster = %plan.cluster.name, error = %e, "the cluster did not take the configuration of a node that came back");
        }
        return;
    }
    for f in order_all(state, std::slice::from_ref(node), |n| plan.order(n)).await {
        tracing::warn!(cluster = %plan.cluster.name, failure = %f, "a node that came back did not take the cluster's current config");
    }
}

/// Stops on `node` the daemons of `clusters` that its agent kept from before, and has it
/// remove their keys and config: the node is not theirs any more.
pub async fn stop_kept(state: &AppState, node: &NodeRow, clusters: &[String]) {
    for cluster in clusters {
        tracing::info!(node = %node.hostname, %cluster, "stopping the daemons of a Slurm cluster the node no longer belongs to");
        for f in order_all(state, std::slice::from_ref(node), |_| stop_order(cluster)).await {
            tracing::warn!(%cluster, failure = %f, "cannot stop a kept slurmd");
        }
    }
}

/// A login port for a cluster made before logins: allocated and recorded (after `fence`).
async fn give_login_port(state: &AppState, fence: &Fence, cluster_id: &str) -> Result<u16> {
    let (id, range, fence) = (cluster_id.to_string(), state.slurm_ports, fence.clone());
    state
        .apply(move |conn| -> Result<u16> {
            fence.check(conn)?;
            let mut taken = store::slurm_access::ports_taken(conn)?;
            let port = new_port(range, &mut taken)?;
            store::slurm_access::set_login_port(conn, &id, port)?;
            Ok(port)
        })
        .await
}

/// The cluster's nodes to ask its controller through (head, backup, others), from the
/// store as it is now.
async fn askable(state: &AppState, c: &ClusterRow) -> Result<Vec<NodeRow>> {
    let id = c.id.clone();
    state
        .read(move |conn| -> Result<Vec<NodeRow>> {
            let access = store::slurm_access::get(conn, &id)?.unwrap_or_default();
            let mut nodes = store::nodes::list(conn, None, Some(&id))?;
            nodes.sort_by(|a, b| a.hostname.cmp(&b.hostname));
            let rank = |n: &NodeRow| match () {
                _ if n.id == access.head_node => 0,
                _ if n.id == access.backup_node => 1,
                _ => 2,
            };
            nodes.sort_by_key(rank);
            Ok(nodes)
        })
        .await
}

/// Waits (bounded) until every expected node is schedulable; Some(why not) if never.
async fn wait_ready(
    state: &AppState,
    cluster: &str,
    askable: &[NodeRow],
    expected: Vec<String>,
) -> Option<String> {
    let started = Instant::now();
    let deadline = started + READY_WITHIN;
    let mut nudged = false;
    loop {
        let why = match queries::ask(state, cluster, askable, "status", &[], "").await {
            Ok(said) => status::not_ready(&expected, &said.nodes),
            Err(e) => Some(format!("Slurm: the controller does not answer: {e}")),
        };
        match why {
            None => return None,
            Some(why) if Instant::now() > deadline => return Some(why),
            // A restarted controller learns of a slurmd that kept running only at its next
            // ping; `scontrol reconfigure` makes every slurmd register now.
            Some(why)
                if !nudged
                    && why.contains(" is unknown")
                    && started.elapsed() > Duration::from_secs(1) =>
            {
                nudged = true;
                if let Err(e) = queries::ask(state, cluster, askable, "reconfigure", &[], "").await
                {
                    tracing::warn!(%cluster, error = %e, "scontrol reconfigure failed");
                }
            }
            Some(_) => tokio::time::sleep(ASK_EVERY).await,
        }
    }
}

/// The cluster's status with Slurm's word on it: a cluster whose nodes are all reachable
/// is `running` only when Slurm can schedule on every node; otherwise `degraded`, saying
/// which node is in which Slurm state.
pub fn overlay(base: (String, String), slurm: Option<String>) -> (String, String) {
    match slurm {
        Some(why) if base.0 == "running" => ("degraded".into(), why),
        _ => base,
    }
}

/// Stops everything of the cluster on `nodes` (and on nodes that left it but may still
/// run something of it), and removes the controllers' state (best effort: a node that
/// cannot be reached is logged, its agent cleans up when it registers again). Nothing for
/// a Kubernetes cluster.
pub async fn remove(state: &Arc<AppState>, c: &ClusterRow, nodes: &[NodeRow]) {
    if !is_slurm(c) {
        return;
    }
    let name = gpufleet_slurm::cluster_name(&c.id);
    let mut all = nodes.to_vec();
    if let Ok(Some(p)) = read_plan(state, &c.id).await {
        for g in p.gone {
            if !all.iter().any(|n| n.id == g.id) {
                all.push(g);
            }
        }
    }
    for f in order_all(state, &all, |_| stop_order(&name)).await {
        tracing::warn!(cluster = %c.name, failure = %f, "cannot stop the cluster's daemons on a node");
    }
    state.slurm.forget(&c.id);
    let shared = state
        .volumes
        .is_shared()
        .then(|| state.volumes.root().to_path_buf());
    let legacy = state.data_dir.join("slurm").join(&name);
    let removed = blocking(move || {
        let mut dirs = match &shared {
            Some(root) => state_dirs::others(root, &name, None),
            None => Vec::new(),
        };
        dirs.push(legacy);
        state_dirs::remove(&dirs).map_err(Error::Internal)
    })
    .await;
    if let Err(e) = removed {
        tracing::warn!(cluster = %c.name, error = %e, "cannot remove the Slurm controllers' state");
    }
}

/// How long a drain waits for a node's running jobs before the change goes ahead (or, for
/// a layout change whose request gives no deadline, gives up).
pub const DRAIN_WITHIN: Duration = Duration::from_secs(600);

/// Drains `node` in its cluster's Slurm (no new jobs) and waits until its jobs have
/// finished, at most `limit`; Err says what still runs.
pub async fn drain(
    state: &AppState,
    c: &ClusterRow,
    node: &str,
    reason: &str,
    limit: Duration,
) -> Result<()> {
    drain_names(state, c, &[node.to_string()], reason, limit).await
}

/// Drains every node of `nodes` at once and waits (at most `limit` in all) until none of
/// them runs a job; Err names those whose jobs still run.
pub async fn drain_nodes(
    state: &AppState,
    c: &ClusterRow,
    nodes: &[NodeRow],
    reason: &str,
    limit: Duration,
) -> Result<()> {
    let names: Vec<String> = nodes.iter().map(|n| n.hostname.clone()).collect();
    drain_names(state, c, &names, reason, limit).await
}

async fn drain_names(
    state: &AppState,
    c: &ClusterRow,
    nodes: &[String],
    reason: &str,
    limit: Duration,
) -> Result<()> {
    if !is_slurm(c) || nodes.is_empty() {
        return Ok(());
    }
    let name = gpufleet_slurm::cluster_name(&c.id);
    let through = askable(state, c).await?;
    let deadline = Instant::now() + limit;
    let reason = format!("gpufleet: {reason}");
    let mut seen = queries::ask(state, &name, &through, "drain", nodes, &reason)
        .await
        .map_err(|e| Error::Aborted(format!("Slurm: cannot drain {}: {e}", nodes.join(", "))))?;
    loop {
        // "drained": no job left; "draining": jobs still run. A node Slurm does not know
        // runs nothing.
        let busy: Vec<String> = nodes
            .iter()
            .filter_map(|n| match seen.nodes.get(n).map(|s| s.state.as_str()) {
                Some("drained") | None => None,
                Some(s) => Some(format!("{n} is still {s}")),
            })
            .collect();
        if busy.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Aborted(format!(
                "{} in Slurm after {limit:?}; its jobs did not finish",
                busy.join(", ")
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        seen = queries::ask(state, &name, &through, "status", &[], "")
            .await
            .map_err(Error::Aborted)?;
    }
}

/// Drains every node of `nodes` at once and waits for their jobs (bounded); a node whose
/// jobs outlast the wait is logged and the change goes ahead.
pub async fn drain_all(state: &AppState, c: &ClusterRow, nodes: &[NodeRow], reason: &str) {
    for n in nodes {
        if let Err(e) = drain(state, c, &n.hostname, reason, DRAIN_WITHIN).await {
            tracing::warn!(cluster = %c.name, node = %n.hostname, error = %e, "Slurm drain did not complete");
        }
    }
}

/// Returns a node drained by [`drain`] to service, and waits (bounded) until Slurm can
/// schedule on it again, so that a rolling change has at most its share of nodes out.
pub async fn resume(state: &AppState, c: &ClusterRow, node: &str) {
    if !is_slurm(c) {
        return;
    }
    let name = gpufleet_slurm::cluster_name(&c.id);
    let through = match askable(state, c).await {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(cluster = %c.name, error = %e, "cannot resume a drained Slurm node");
            return;
        }
    };
    let names = [node.to_string()];
    if let Err(e) = queries::ask(state, &name, &through, "resume", &names, "").await {
        tracing::warn!(cluster = %c.name, error = %e, "cannot resume a drained Slurm node");
        return;
    }
    if let Some(why) = wait_ready(state, &name, &through, names.to_vec()).await {
        tracing::warn!(cluster = %c.name, %why, "a resumed Slurm node is not schedulable yet");
    }
}

/// Records the greatest next job id a controller of the cluster reported: a controller that
/// replaces it without its state starts past it.
/// The supervisor's (a singleton's): fenced.
async fn record_next_job_id(state: &Arc<AppState>, fence: &Fence, cluster_id: &str, next: u64) {
    let (id, fence) = (cluster_id.to_string(), fence.clone());
    let recorded = state
        .apply(move |conn| -> Result<bool> {
            fence.check(conn)?;
            Ok(store::slurm_access::raise_next_job_id(conn, &id, next)?)
        })
        .await;
    if let Err(e) = recorded {
        tracing::warn!(cluster = %cluster_id, error = %e, "cannot record the cluster's next job id");
    }
}

/// One pass of the supervisor over the settled Slurm clusters: each brought to its nodes
/// when what it should run changed (or after a start of this control plane), and its
/// status following what Slurm says about its nodes. A singleton: what it records is
/// fenced by the lease (`crate::lease`).
async fn watch_once(state: &Arc<AppState>) -> Result<()> {
    let fence = Fence::singleton(state.lease().clone());
    let clusters = state
        .read(|conn| -> Result<Vec<ClusterRow>> {
            Ok(
                store::clusters::with_status(conn, &["running", "degraded"])?
                    .into_iter()
                    .filter(is_slurm)
                    .collect(),
            )
        })
        .await?;
    let watched: BTreeSet<String> = clusters.iter().map(|c| c.id.clone()).collect();
    state.agents.telemetry.keep_jobs_of(&watched);
    for c in clusters {
        let tracked = state.slurm.of(&c.id);
        // As it should be (a replaced node changes it outside any request)?
        let (current, next_recorded) = match read_plan(state, &c.id).await? {
            Some(p) => (
                tracked.applied() == Some(p.fingerprint()),
                p.access.next_job_id,
            ),
            None => continue,
        };
        let (mut slurm_says, jobs) = if current {
            let name = gpufleet_slurm::cluster_name(&c.id);
            let through = askable(state, &c).await?;
            let expected: Vec<String> = through.iter().map(|n| n.hostname.clone()).collect();
            match queries::ask(state, &name, &through, "status", &[], "").await {
                Ok(said) => {
                    if said.next_job_id > next_recorded {
                        record_next_job_id(state, &fence, &c.id, said.next_job_id).await;
                    }
                    (status::not_ready(&expected, &said.nodes), said.jobs)
                }
                Err(e) => (
                    Some(format!("Slurm: the controller does not answer: {e}")),
                    None,
                ),
            }
        } else {
            // After a start of this control plane, a replacement, a node that left.
            let _one = tracked.bring_up.lock().await;
            let why =
                match bring_up(state, (&fence, By::Supervisor), &tracked, &c.id, &[], &[]).await {
                    Ok(why) => why,
                    Err(e) => Some(format!("Slurm: {e}")),
                };
            (why, None)
        };
        // A cluster its last acceptance probe found unusable stays so until a probe
        // passes (tried again every PROBE_AGAIN).
        if slurm_says.is_none() {
            if let Some((why, at)) = tracked.unaccepted() {
                slurm_says = match at.elapsed() > PROBE_AGAIN {
                    false => Some(why),
                    true => {
                        let why = accept(state, &c.id).await;
                        tracked.set_unaccepted(why.clone());
                        why
                    }
                };
            }
        }
        // The team's jobs, for its metrics: only what the controller answers now.
        state.agents.telemetry.record_jobs(&c.id, jobs);
        let (replace_after, fence) = (state.agents.replace_after, fence.clone());
        state
            .apply(move |conn| record_status(conn, &fence, &c, replace_after, slurm_says))
            .await?;
    }
    Ok(())
}

/// The supervisor's record of a Slurm cluster's status: the settled one with what Slurm
/// says over it, after the fence (nothing once this replica lost the lease).
fn record_status(
    conn: &impl AsConn,
    fence: &Fence,
    c: &ClusterRow,
    replace_after: Duration,
    slurm_says: Option<String>,
) -> Result<()> {
    fence.check(conn)?;
    let base = crate::cluster_status::settled_status(conn, &c.id, replace_after)?;
    let (status, reason) = overlay(base, slurm_says);
    if store::clusters::set_settled_status(conn, &c.id, &status, &reason)? {
        tracing::info!(cluster = %c.name, %status, %reason, "Slurm cluster status");
    }
    Ok(())
}

/// Retires what a control plane from before kept of its clusters' controllers and logins
/// on its own host (`<data-dir>/slurm/<cluster>/`, and the login's part of the runtime
/// directory): the login's host key moves to the store (so known_hosts stays valid), the
/// rest goes, and so does the account when no node of the cluster runs here. Their
/// daemons stopped with that control plane; the cluster's head node runs them now.
fn retire_legacy(state: &AppState, conn: &impl AsConn) -> Result<()> {
    let root = state.data_dir.join("slurm");
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Ok(());
    };
    let clusters: HashMap<String, ClusterRow> = store::clusters::list(conn, None, None, None)?
        .into_iter()
        .filter(is_slurm)
        .map(|c| (gpufleet_slurm::cluster_name(&c.id), c))
        .collect();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !gpufleet_slurm::valid_cluster_name(&name) {
            continue;
        }
        if let Some(c) = clusters.get(&name) {
            let kept = store::slurm_access::get(conn, &c.id)?.unwrap_or_default();
            if !kept.login_host_key.is_empty() {
                tracing::info!(cluster = %name, "retiring the control plane's old controller and login files");
                let _ = std::fs::remove_dir_all(e.path());
            }
            // Else kept until the next bring-up has taken the host key.
        } else {
            tracing::info!(cluster = %name, "removing the state of a Slurm controller whose cluster is gone");
            let _ = std::fs::remove_dir_all(e.path());
        }
        if let Err(e) = account::release_node(&name, "login") {
            tracing::warn!(cluster = %name, error = %e, "cannot remove an old login's runtime files");
        }
    }
    Ok(())
}

/// The control plane's watch over its Slurm clusters, until `stop`. It stops nothing when
/// it ends: every daemon of a cluster is its nodes' agents'.
pub async fn supervise(state: Arc<AppState>, mut stop: watch::Receiver<bool>) {
    loop {
        if let Err(e) = watch_once(&state).await {
            tracing::warn!(error = %e, "cannot check the Slurm clusters");
        }
        {
            let st = state.clone();
            if let Err(e) = state.read(move |conn| retire_legacy(&st, conn)).await {
                tracing::warn!(error = %e, "cannot retire old Slurm state");
            }
        }
        tokio::select! {
            _ = gpufleet_process::signals::stopped(&mut stop) => break,
            _ = tokio::time::sleep(WATCH_EVERY) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_former_leaders_supervisor_records_no_status_and_the_leaders_does() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = super::store::open(&dir.path().join("state.db")).unwrap();
        crate::lease::testing::seed(&conn);
        let (stale, current) = crate::lease::testing::stale_and_current(&mut conn);
        let c1 = super::store::clusters::get(&conn, "c1").unwrap().unwrap();
        let down = || Some("Slurm: n1 is down*".to_string());
        let after = std::time::Duration::from_secs(60);
        let tx = conn.transaction().unwrap();
        let refused = super::record_status(&tx, &stale, &c1, after, down())
            .unwrap_err()
            .to_string();
        drop(tx);
        assert!(refused.contains("writes nothing"), "{refused}");
        let now = super::store::clusters::get(&conn, "c1").unwrap().unwrap();
        assert_eq!(
            (now.status.as_str(), now.status_reason.as_str()),
            ("running", "")
        );
        super::record_status(&conn, &current, &c1, after, down()).unwrap();
        let now = super::store::clusters::get(&conn, "c1").unwrap().unwrap();
        assert_eq!(
            (now.status.as_str(), now.status_reason.as_str()),
            ("degraded", "Slurm: n1 is down*")
        );
    }

    #[test]
    fn a_new_head_starts_past_every_job_id_given_within_slurms_bound() {
        // Never read yet (a head lost at once): past the ids it may have given all the same.
        assert_eq!(super::first_job_id(0), 1 + super::JOB_ID_MARGIN);
        assert_eq!(super::first_job_id(7), 7 + super::JOB_ID_MARGIN);
        assert_eq!(
            super::first_job_id(u64::MAX - 1),
            gpufleet_slurm::conf::MAX_FIRST_JOB_ID
        );
    }

    #[test]
    fn a_host_without_slurm_refuses_naming_orchestrator_and_what_is_missing() {
        let e = super::refuse_without(&["slurmctld", "munged"]).unwrap_err();
        assert!(matches!(e, crate::error::Error::Precondition(_)));
        let text = e.to_string();
        assert!(
            text.starts_with("orchestrator: ") && text.contains("slurmctld, munged are missing"),
            "{text}"
        );
        assert!(super::refuse_without(&[]).is_ok());
        // A fake cgroup root with only the cpu hierarchy mounted.
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("cpu")).unwrap();
        std::fs::write(root.path().join("cpu/cgroup.procs"), "").unwrap();
        let e = super::refuse_without_cgroups(root.path()).unwrap_err();
        assert!(matches!(e, crate::error::Error::Precondition(_)));
        let text = e.to_string();
        let freezer = root.path().join("freezer");
        assert!(
            text.starts_with("orchestrator: ")
                && text.contains(&format!(
                    "'freezer' is not mounted at {}",
                    freezer.display()
                ))
                && !text.contains("'cpu'"),
            "{text}"
        );
    }

    #[test]
    fn slurm_says_degraded_only_over_a_running_cluster() {
        let running = ("running".to_string(), String::new());
        assert_eq!(
            super::overlay(running.clone(), Some("Slurm: n1 is down*".into())),
            ("degraded".to_string(), "Slurm: n1 is down*".to_string())
        );
        assert_eq!(super::overlay(running.clone(), None), running);
        let unreachable = ("degraded".to_string(), "node(s) n1 unreachable".to_string());
        assert_eq!(
            super::overlay(unreachable.clone(), Some("Slurm: n1 is down*".into())),
            unreachable
        );
    }
}
