//! The lifecycle of a Slurm tenant cluster, between the store, the controller this process
//! runs and the node agents' slurmd: bring it up (or to its new nodes and layout) after
//! the MIG changes converged, take it down on delete, watch what Slurm says about its
//! nodes for the cluster's status, and restart controllers after a control plane restart.
//!
//! The controllers and logins are reached at the control plane's advertised address
//! (`serve --advertise-address`, [`AppState::slurm_address`]): slurm.conf's
//! `SlurmctldHost=localhost(ADDR)`, the login's `ListenAddress`, the cluster's `endpoint`
//! and `credentials`. Every bring-up writes the endpoint and credentials again, so they
//! follow a control plane restarted with another address. Each node is declared as its
//! agent last registered its host (`store::nodes::host`: NodeAddr, NodeHostname, CPUs,
//! RealMemory).
//!
//! Changes that would end running jobs drain the nodes in Slurm first and wait for their
//! jobs: a driver roll (`scheduling::drivers`), a scale-down and a layout change
//! (`services::clusters`, through [`drain_nodes`] and [`apply_resuming`]).
//!
//! On shutdown the supervisor stops the controllers and logins (a login's sessions end
//! with it); the node agents end their slurmd and the job steps they started, so a stopped
//! control plane with embedded agents leaves no process of a cluster's account.
//!
//! Slurm is real: a host without slurmctld, slurmd or munged refuses Slurm clusters.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpufleet_proto::v1;
use rusqlite::Connection;
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::registry::Outcome;
use crate::state::AppState;
use crate::store::slurm_access::SlurmAccess;
use crate::store::{self, clusters::ClusterRow, nodes::NodeRow};
use gpufleet_slurm::account::Account;
use gpufleet_slurm::{conf, controller, login, munge, status};

/// How long a bring-up waits for every node to be schedulable before it reports the
/// cluster degraded (with the Slurm states) instead of running.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// How often the supervisor looks at the controllers and their nodes.
const WATCH_EVERY: Duration = Duration::from_secs(2);

pub fn is_slurm(c: &ClusterRow) -> bool {
    c.orchestrator == "slurm"
}

/// Refuses a Slurm cluster on a host without Slurm, munge and sshd, or where the control
/// plane cannot make the cluster's account, rather than pretending.
pub fn require(orchestrator: &str) -> Result<()> {
    if orchestrator != "slurm" {
        return Ok(());
    }
    refuse_without(&gpufleet_slurm::missing())?;
    // SAFETY: geteuid only reads the process's credentials.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Error::Precondition(
            "orchestrator: \"slurm\" gives each cluster an account of its own and a login sshd on the control plane's host, which needs the control plane to run as root".into(),
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
        "orchestrator: \"slurm\" runs a real Slurm controller on the control plane's host, and {} {} missing there; install Debian's slurm-wlm, munge and openssh-server (scripts/bootstrap.sh does)",
        missing.join(", "),
        if missing.len() == 1 { "is" } else { "are" }
    )))
}

/// What the team is given: how to log in, and how to check the login's host key. Nothing
/// in it grants more than a session as the cluster's own account.
fn credentials(desired: &controller::Desired, access: &controller::Access) -> String {
    let (host, port, user) = (
        &desired.controller.addr,
        desired.login_port,
        &desired.account.name,
    );
    serde_json::json!({
        "cluster": desired.controller.cluster,
        "user": user,
        "host": host,
        "port": port,
        "login": format!("ssh -p {port} {user}@{host}"),
        "known_hosts": login::known_hosts_line(host, port, &access.host_key),
        "home": access.home.display().to_string(),
    })
    .to_string()
}

/// A new Slurm cluster's access: a munge key of its own and free ports for its controller
/// and its login (the endpoint). Record it with [`record`] once the cluster is stored.
pub struct NewAccess {
    munge_key: String,
    controller_port: u16,
    login_port: u16,
}

pub fn prepare(c: &mut ClusterRow, addr: std::net::IpAddr) -> Result<Option<NewAccess>> {
    if !is_slurm(c) {
        return Ok(None);
    }
    let controller_port = controller::free_port().map_err(Error::Internal)?;
    let login_port = loop {
        let p = controller::free_port().map_err(Error::Internal)?;
        if p != controller_port {
            break p;
        }
    };
    c.endpoint = endpoint(addr, login_port);
    c.credentials = String::new();
    Ok(Some(NewAccess {
        munge_key: munge::encode(&munge::new_key()),
        controller_port,
        login_port,
    }))
}

/// How many candidate uids a new cluster tries before it is refused.
const UID_ATTEMPTS: u32 = 64;

/// Stores a new cluster's access with the team's keys, and its account's uid: the first
/// candidate no other cluster has. (A host where a user or group already has it refuses
/// the bring-up naming both; the candidates are spread over 100 million uids, so two
/// control planes sharing a host rarely meet. No host lookup runs here, on the writer.)
pub fn record(
    conn: &Connection,
    cluster_id: &str,
    new: NewAccess,
    ssh_public_keys: &[String],
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
    store::slurm_access::insert(
        conn,
        &SlurmAccess {
            cluster_id: cluster_id.to_string(),
            munge_key: new.munge_key,
            uid,
            controller_port: new.controller_port,
            login_port: new.login_port,
            ssh_public_keys: ssh_public_keys.to_vec(),
        },
    )?;
    Ok(())
}

fn access_of(conn: &Connection, c: &ClusterRow) -> Result<SlurmAccess> {
    store::slurm_access::get(conn, &c.id)?.ok_or_else(|| {
        Error::Internal(format!(
            "cluster {}: its Slurm access is not recorded",
            c.name
        ))
    })
}

/// The login's `host:port` as the cluster's `endpoint` gives it.
fn endpoint(addr: std::net::IpAddr, login_port: u16) -> String {
    format!("{addr}:{login_port}")
}

fn controller_of(state: &AppState, c: &ClusterRow, access: &SlurmAccess) -> conf::Controller {
    conf::Controller {
        cluster: gpufleet_slurm::cluster_name(&c.id),
        addr: state.slurm_address.to_string(),
        port: access.controller_port,
    }
}

/// What the cluster's Slurm should be now, from the store.
struct Plan {
    cluster: ClusterRow,
    desired: controller::Desired,
    nodes: Vec<NodeRow>,
}

fn plan(state: &AppState, conn: &Connection, cluster_id: &str) -> Result<Option<Plan>> {
    let Some(c) = store::clusters::get(conn, cluster_id)? else {
        return Ok(None);
    };
    if !is_slurm(&c) {
        return Ok(None);
    }
    let access = access_of(conn, &c)?;
    let ctl = controller_of(state, &c, &access);
    let mut nodes = store::nodes::list(conn, None, Some(&c.id))?;
    nodes.sort_by(|a, b| a.hostname.cmp(&b.hostname));
    // A node keeps its slurmd port across changes; new nodes get free ones.
    let known = controller::node_ports(&state.data_dir, &ctl.cluster);
    let mut taken: BTreeSet<u16> = known.values().copied().collect();
    taken.insert(ctl.port);
    taken.insert(access.login_port);
    let mut out = Vec::new();
    for n in &nodes {
        let gpus = crate::recorded::recorded_gpus(conn, &n.id)?.len() as u32;
        let port = match known.get(&n.hostname) {
            Some(p) => *p,
            None => loop {
                let p = controller::free_port().map_err(Error::Internal)?;
                if taken.insert(p) {
                    break p;
                }
            },
        };
        // As its agent last declared its host (a node that has not registered since hosts
        // were recorded: this host, 1 CPU).
        let host = store::nodes::host(conn, &n.id)?.unwrap_or_else(|| store::nodes::NodeHost {
            address: "127.0.0.1".into(),
            hostname: "localhost".into(),
            cpus: 1,
            memory_mib: 0,
            simulated: false,
        });
        out.push(conf::Node {
            name: n.hostname.clone(),
            host: host.hostname,
            addr: host.address,
            port,
            cpus: host.cpus,
            memory_mib: host.memory_mib,
            gres: conf::node_gres(&c.gpu_type, gpus, &c.mig_layout),
            simulated: host.simulated,
        });
    }
    let key = munge::decode(&access.munge_key)
        .map_err(|e| Error::Internal(format!("cluster {}: {e}", c.name)))?;
    Ok(Some(Plan {
        desired: controller::Desired {
            account: Account::new(&ctl.cluster, access.uid).map_err(Error::Internal)?,
            controller: ctl,
            nodes: out,
            key,
            slurm_user: gpufleet_slurm::current_user(),
            login_port: access.login_port,
            ssh_public_keys: access.ssh_public_keys,
        },
        cluster: c,
        nodes,
    }))
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::Internal(format!("a Slurm worker failed: {e}")))?
}

fn start_order(p: &Plan, shared: &str) -> v1::WorkOrder {
    v1::WorkOrder {
        id: uuid::Uuid::new_v4().to_string(),
        kind: Some(v1::work_order::Kind::StartSlurmd(v1::StartSlurmd {
            cluster: p.desired.controller.cluster.clone(),
            slurm_conf: shared.to_string(),
            cgroup_conf: conf::cgroup(),
            munge_key: p.desired.key.clone(),
            uid: p.desired.account.uid,
        })),
    }
}

fn stop_order(cluster: &str) -> v1::WorkOrder {
    v1::WorkOrder {
        id: uuid::Uuid::new_v4().to_string(),
        kind: Some(v1::work_order::Kind::StopSlurmd(v1::StopSlurmd {
            cluster: cluster.to_string(),
        })),
    }
}

/// Sends `order` (a fresh copy per node) to every node and gathers the failures.
async fn order_all(
    state: &AppState,
    nodes: &[NodeRow],
    order: impl Fn() -> v1::WorkOrder,
) -> Vec<String> {
    let waits: Vec<_> = nodes
        .iter()
        .map(|n| (n, state.agents.dispatch(&n.id, order())))
        .collect();
    let mut failed = Vec::new();
    for (n, wait) in waits {
        match wait.await {
            Ok(Outcome::Answered(r)) if r.ok => {}
            Ok(Outcome::Answered(r)) => failed.push(format!("{}: {}", n.hostname, r.error)),
            Ok(Outcome::Unreachable(why)) => failed.push(format!("{}: {why}", n.hostname)),
            Err(_) => failed.push(format!("{}: the control plane is stopping", n.hostname)),
        }
    }
    failed
}

/// Brings a Slurm cluster to its nodes and layout in the store (after the MIG changes
/// converged): the controller (re)started with the new slurm.conf, slurmd ordered on every
/// node, slurmd stopped on `released` nodes, the tenant's credentials updated. Returns why
/// the cluster is not ready yet (the Slurm state of each node that is not), if it is not
/// within a bounded wait. Nothing for a Kubernetes cluster.
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
    let plan = {
        let (state, id) = (state.clone(), cluster_id.to_string());
        let planner = state.clone();
        state.read(move |conn| plan(&planner, conn, &id)).await?
    };
    let Some(mut plan) = plan else {
        return Ok(None);
    };
    if plan.desired.login_port == 0 {
        plan.desired.login_port = give_login_port(state, &plan.cluster.id).await?;
    }
    let name = plan.desired.controller.cluster.clone();
    let access = {
        let (data_dir, desired) = (state.data_dir.clone(), plan.desired.clone());
        blocking(move || {
            controller::ensure(&data_dir, &desired).map_err(|e| {
                Error::Aborted(format!(
                    "orchestrator: the cluster's Slurm controller did not start: {e}"
                ))
            })
        })
        .await?
    };
    let shared = conf::shared(
        &plan.desired.controller,
        &plan.desired.nodes,
        &plan.desired.slurm_user,
    );
    let failed = order_all(state, &plan.nodes, || start_order(&plan, &shared)).await;
    if !released.is_empty() {
        for f in order_all(state, released, || stop_order(&name)).await {
            tracing::warn!(cluster = %plan.cluster.name, failure = %f, "cannot stop slurmd on a released node");
        }
    }
    if !failed.is_empty() {
        return Err(Error::Aborted(format!(
            "orchestrator: slurmd did not start on {}",
            failed.join("; ")
        )));
    }
    {
        // The endpoint follows --advertise-address (a control plane restarted with another
        // one moves its clusters' logins there).
        let (state, id) = (state.clone(), plan.cluster.id.clone());
        let creds = credentials(&plan.desired, &access);
        let endpoint = endpoint(state.slurm_address, plan.desired.login_port);
        state
            .apply(move |conn| -> Result<()> {
                store::clusters::set_credentials(conn, &id, &creds)?;
                store::clusters::set_endpoint(conn, &id, &endpoint)?;
                Ok(())
            })
            .await?;
    }
    for n in drained {
        // The controller kept their drain across its restart.
        if let Err(e) = set_state(state, &name, &n.hostname, &["state=resume"]).await {
            tracing::warn!(cluster = %plan.cluster.name, node = %n.hostname, error = %e, "cannot resume a drained Slurm node");
        }
    }
    let expected: Vec<String> = plan.nodes.iter().map(|n| n.hostname.clone()).collect();
    Ok(wait_ready(state, &name, expected).await)
}

/// `scontrol update nodename=<node> <args>` on the cluster's controller.
async fn set_state(state: &AppState, cluster: &str, node: &str, args: &[&str]) -> Result<()> {
    let conf = controller::conf_path(&state.data_dir, cluster);
    let mut all = vec![format!("nodename={node}")];
    all.extend(args.iter().map(|a| a.to_string()));
    blocking(move || {
        let args: Vec<&str> = all.iter().map(String::as_str).collect();
        status::run(
            "scontrol",
            &["update"].iter().copied().chain(args).collect::<Vec<_>>(),
            &conf,
            Duration::from_secs(10),
        )
        .map(|_| ())
        .map_err(Error::Aborted)
    })
    .await
}

/// A node of a Slurm cluster whose agent registered again (it restarted, or was cut off
/// and came back): its slurmd gets the cluster's configuration as it is now, not the one
/// its agent kept from before (a gres.conf of an old layout, a controller that moved), and
/// the controller the node's host as it declared it now.
pub async fn rejoin(state: &Arc<AppState>, node: &NodeRow) {
    let Some(cluster_id) = node.cluster_id.clone() else {
        return;
    };
    let plan = {
        let planner = state.clone();
        state
            .read(move |conn| plan(&planner, conn, &cluster_id))
            .await
    };
    let plan = match plan {
        Ok(Some(p)) if p.nodes.iter().any(|n| n.id == node.id) => p,
        Ok(_) => return,
        Err(e) => {
            tracing::warn!(node = %node.hostname, error = %e, "cannot plan the Slurm config of a node that came back");
            return;
        }
    };
    // The controller takes the node as it declared its host now (another address, CPUs or
    // memory); it is restarted only when its slurm.conf changes.
    {
        let (data_dir, desired) = (state.data_dir.clone(), plan.desired.clone());
        let ensured = blocking(move || {
            controller::ensure(&data_dir, &desired)
                .map(|_| ())
                .map_err(Error::Aborted)
        })
        .await;
        if let Err(e) = ensured {
            tracing::warn!(cluster = %plan.cluster.name, error = %e, "the controller did not take the configuration of a node that came back");
        }
    }
    let shared = conf::shared(
        &plan.desired.controller,
        &plan.desired.nodes,
        &plan.desired.slurm_user,
    );
    for f in order_all(state, std::slice::from_ref(node), || {
        start_order(&plan, &shared)
    })
    .await
    {
        tracing::warn!(cluster = %plan.cluster.name, failure = %f, "slurmd did not take the current config on a node that came back");
    }
}

/// Stops on `node` the daemons of `clusters` that its agent kept from before, and has it
/// remove their keys and config: the node is not theirs any more.
pub async fn stop_kept(state: &AppState, node: &NodeRow, clusters: &[String]) {
    for cluster in clusters {
        tracing::info!(node = %node.hostname, %cluster, "stopping the daemons of a Slurm cluster the node no longer belongs to");
        for f in order_all(state, std::slice::from_ref(node), || stop_order(cluster)).await {
            tracing::warn!(%cluster, failure = %f, "cannot stop a kept slurmd");
        }
    }
}

/// A login port for a cluster made before logins: allocated, recorded, and the endpoint.
async fn give_login_port(state: &AppState, cluster_id: &str) -> Result<u16> {
    let port = controller::free_port().map_err(Error::Internal)?;
    let (id, addr) = (cluster_id.to_string(), state.slurm_address);
    state
        .apply(move |conn| -> Result<()> {
            store::slurm_access::set_login_port(conn, &id, port)?;
            store::clusters::set_endpoint(conn, &id, &endpoint(addr, port))?;
            Ok(())
        })
        .await?;
    Ok(port)
}

/// Waits (bounded) until every expected node is schedulable; Some(why not) if never.
async fn wait_ready(state: &AppState, cluster: &str, expected: Vec<String>) -> Option<String> {
    let conf = controller::conf_path(&state.data_dir, cluster);
    let started = Instant::now();
    let deadline = started + READY_WITHIN;
    let mut nudged = false;
    loop {
        let (conf2, expected) = (conf.clone(), expected.clone());
        let why = tokio::task::spawn_blocking(move || match status::nodes(&conf2) {
            Ok(seen) => status::not_ready(&expected, &seen),
            Err(e) => Some(format!("Slurm: the controller does not answer: {e}")),
        })
        .await
        .unwrap_or_else(|e| Some(format!("Slurm: {e}")));
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
                let conf = conf.clone();
                let done = tokio::task::spawn_blocking(move || {
                    status::run("scontrol", &["reconfigure"], &conf, Duration::from_secs(10))
                })
                .await;
                if let Ok(Err(e)) = done {
                    tracing::warn!(%cluster, error = %e, "scontrol reconfigure failed");
                }
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(100)).await,
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

/// Stops the cluster's slurmd on `nodes` and its controller, and removes their state
/// (best effort: a node that cannot be reached is logged, its agent cleans up when told
/// again). Nothing for a Kubernetes cluster.
pub async fn remove(state: &Arc<AppState>, c: &ClusterRow, nodes: &[NodeRow]) {
    if !is_slurm(c) {
        return;
    }
    let name = gpufleet_slurm::cluster_name(&c.id);
    for f in order_all(state, nodes, || stop_order(&name)).await {
        tracing::warn!(cluster = %c.name, failure = %f, "cannot stop slurmd on a node");
    }
    let data_dir = state.data_dir.clone();
    let removed =
        blocking(move || controller::remove(&data_dir, &name).map_err(Error::Internal)).await;
    if let Err(e) = removed {
        tracing::warn!(cluster = %c.name, error = %e, "cannot remove the Slurm controller's state");
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
    let conf = controller::conf_path(&state.data_dir, &name);
    let reason = format!("reason=gpufleet: {reason}");
    let deadline = Instant::now() + limit;
    for node in nodes {
        set_state(state, &name, node, &["state=drain", &reason]).await?;
    }
    loop {
        let conf2 = conf.clone();
        let seen = blocking(move || status::nodes(&conf2).map_err(Error::Aborted)).await?;
        // "drained": no job left; "draining": jobs still run. A node Slurm does not know
        // runs nothing.
        let busy: Vec<String> = nodes
            .iter()
            .filter_map(|n| match seen.get(n).map(|s| s.state.as_str()) {
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
    if let Err(e) = set_state(state, &name, node, &["state=resume"]).await {
        tracing::warn!(cluster = %c.name, error = %e, "cannot resume a drained Slurm node");
        return;
    }
    if let Some(why) = wait_ready(state, &name, vec![node.to_string()]).await {
        tracing::warn!(cluster = %c.name, %why, "a resumed Slurm node is not schedulable yet");
    }
}

/// One pass of the supervisor over the settled Slurm clusters: their controllers running
/// (started again after a control plane restart, from the state they kept), and their
/// status following what Slurm says about their nodes.
async fn watch_once(state: &Arc<AppState>) -> Result<()> {
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
        let name = gpufleet_slurm::cluster_name(&c.id);
        // Running, and with the nodes the store gives the cluster (a replaced node changes
        // them outside any request).
        let running = {
            let (st, name, id) = (state.clone(), name.clone(), c.id.clone());
            state
                .read(move |conn| -> Result<bool> {
                    let state = st;
                    let held: BTreeSet<String> = store::nodes::list(conn, None, Some(&id))?
                        .into_iter()
                        .map(|n| n.hostname)
                        .collect();
                    let configured: BTreeSet<String> =
                        controller::node_ports(&state.data_dir, &name)
                            .into_keys()
                            .collect();
                    Ok(controller::is_running(&state.data_dir, &name) && held == configured)
                })
                .await?
        };
        // The team's jobs, for its metrics: only what the controller answers now.
        let jobs = if running {
            let conf = controller::conf_path(&state.data_dir, &name);
            match tokio::task::spawn_blocking(move || status::jobs(&conf)).await {
                Ok(Ok(counts)) => Some(counts),
                Ok(Err(e)) => {
                    tracing::debug!(cluster = %c.name, error = %e, "cannot count the Slurm jobs");
                    None
                }
                Err(_) => None,
            }
        } else {
            None
        };
        state.agents.telemetry.record_jobs(&c.id, jobs);
        let slurm_says = if running {
            let conf = controller::conf_path(&state.data_dir, &name);
            let id = c.id.clone();
            state
                .read(move |conn| -> Result<Option<String>> {
                    let expected: Vec<String> = store::nodes::list(conn, None, Some(&id))?
                        .into_iter()
                        .map(|n| n.hostname)
                        .collect();
                    Ok(match status::nodes(&conf) {
                        Ok(seen) => status::not_ready(&expected, &seen),
                        Err(e) => Some(format!("Slurm: the controller does not answer: {e}")),
                    })
                })
                .await?
        } else {
            // After a restart or a replacement: the controller and slurmd as they should be.
            match apply(state, &c.id, &[]).await {
                Ok(why) => why,
                Err(e) => Some(format!("Slurm: {e}")),
            }
        };
        let replace_after = state.agents.replace_after;
        state
            .apply(move |conn| -> Result<()> {
                let base = crate::cluster_status::settled_status(conn, &c.id, replace_after)?;
                let (status, reason) = overlay(base, slurm_says);
                if store::clusters::set_settled_status(conn, &c.id, &status, &reason)? {
                    tracing::info!(cluster = %c.name, %status, %reason, "Slurm cluster status");
                }
                Ok(())
            })
            .await?;
    }
    Ok(())
}

/// Removes controller state left by clusters that no longer exist (e.g. a create a
/// restart took back).
fn remove_orphans(state: &AppState, conn: &Connection) -> Result<()> {
    let names: BTreeSet<String> = store::clusters::list(conn, None, None, None)?
        .iter()
        .filter(|c| is_slurm(c))
        .map(|c| gpufleet_slurm::cluster_name(&c.id))
        .collect();
    let root = state.data_dir.join("slurm");
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Ok(());
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if gpufleet_slurm::valid_cluster_name(&name) && !names.contains(&name) {
            tracing::info!(cluster = %name, "removing the state of a Slurm controller whose cluster is gone");
            let _ = controller::remove(&state.data_dir, &name);
        }
    }
    Ok(())
}

/// The control plane's watch over its Slurm controllers, until `stop`; then it stops them
/// (their state stays for the next start).
pub async fn supervise(state: Arc<AppState>, mut stop: watch::Receiver<bool>) {
    {
        let st = state.clone();
        if let Err(e) = state.read(move |conn| remove_orphans(&st, conn)).await {
            tracing::warn!(error = %e, "cannot look for leftover Slurm state");
        }
    }
    loop {
        if let Err(e) = watch_once(&state).await {
            tracing::warn!(error = %e, "cannot check the Slurm clusters");
        }
        tokio::select! {
            _ = gpufleet_process::signals::stopped(&mut stop) => break,
            _ = tokio::time::sleep(WATCH_EVERY) => {}
        }
    }
    let data_dir = state.data_dir.clone();
    let _ = tokio::task::spawn_blocking(move || controller::stop_all(&data_dir)).await;
}

#[cfg(test)]
mod tests {
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
        assert!(super::require("kubernetes").is_ok());
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
