//! Node health: checks ordered through the node agents (each agent runs them on its own
//! hardware and reports verdicts with values and thresholds), a bandwidth test across a
//! cluster's nodes, and what follows a failure: the node is quarantined, leaves its
//! cluster and is replaced from the same source (`drivers::quarantine` / `replace`), and
//! the replacement is checked in turn.
//!
//! When checks run: before a registered node joins the pool (medium), before a cluster
//! with new nodes is settled (the cluster's acceptance level), when a tenant asks, every
//! `--health-interval` on ready nodes (quick), and before an operator's returned node is
//! back in service (medium). No lock is held while the agents work.

use std::sync::Arc;
use std::time::Duration;

use gpufleet_proto::limits::MAX_BANDWIDTH_GBPS;
use gpufleet_proto::v1;
use gpufleet_sql::AsConn;
use gpufleet_wire::checks::BANDWIDTH_NO_DATA as NO_DATA;
use tokio::sync::watch;

use super::{breaker, drivers};
use crate::error::{Error, Result};
use crate::lease::Fence;
use crate::registry::Outcome;
use crate::state::AppState;
use crate::store::{
    self,
    clusters::ClusterRow,
    health::{Acceptance, Check, ResultRow},
    nodes::{NodeRow, NODE_BUSY, NODE_QUARANTINED, NODE_READY},
};

/// The levels, lowest first; each includes the checks of the lower ones.
pub const LEVELS: [&str; 3] = ["quick", "medium", "long"];

/// The level a node passes before it joins the pool or returns to service.
pub const ADMISSION_LEVEL: &str = "medium";

/// Rounds of check-and-replace for one cluster run before it gives up.
const MAX_ROUNDS: usize = 4;

pub use crate::state::HealthSettings as Settings;

/// A level from a request; `attribute` names the field in the error.
pub fn level(attribute: &str, text: &str) -> Result<String> {
    if LEVELS.contains(&text) {
        Ok(text.to_string())
    } else {
        Err(Error::Invalid(format!(
            "{attribute}: must be \"quick\", \"medium\" or \"long\" (got \"{}\")",
            text.chars().take(32).collect::<String>()
        )))
    }
}

/// A cluster's acceptance settings from a create or update request; `set` false keeps
/// `current` (the defaults for a new cluster). The threshold is bounded by what the fleet
/// says its `gpu_type` nodes deliver (`delivers`, from the fleet definition).
pub fn acceptance_settings(
    current: Acceptance,
    set: bool,
    level_text: &str,
    min_bus_bandwidth_gbps: f64,
    run_on_create: bool,
    gpu_type: &str,
    delivers: &crate::fleet::Delivers,
) -> Result<Acceptance> {
    if !set {
        return Ok(current);
    }
    let level_text = if level_text.is_empty() {
        ADMISSION_LEVEL
    } else {
        level_text
    };
    if !min_bus_bandwidth_gbps.is_finite()
        || !(0.0..=MAX_BANDWIDTH_GBPS).contains(&min_bus_bandwidth_gbps)
    {
        return Err(Error::Invalid(format!(
            "acceptance.min_bus_bandwidth_gbps: must be between 0 and {MAX_BANDWIDTH_GBPS} Gbit/s (got {min_bus_bandwidth_gbps})"
        )));
    }
    if let Some(declared) = delivers.bus_bandwidth_gbps(gpu_type) {
        if min_bus_bandwidth_gbps > declared {
            return Err(Error::Invalid(format!(
                "acceptance.min_bus_bandwidth_gbps: must be at most {declared} Gbit/s, the bus bandwidth this fleet declares its {gpu_type} nodes deliver (got {min_bus_bandwidth_gbps})"
            )));
        }
    }
    Ok(Acceptance {
        level: level("acceptance.level", level_text)?,
        min_bus_bandwidth_gbps,
        run_on_create,
        ..current
    })
}

/// Bus bandwidth of an all-reduce among `n` nodes whose slowest pair moves `algbw`:
/// busbw = algbw x 2(n-1)/n (nccl-tests' convention); 0 below two nodes.
pub fn bus_bandwidth(algbw: f64, n: usize) -> f64 {
    if n < 2 {
        return 0.0;
    }
    algbw * 2.0 * (n - 1) as f64 / n as f64
}

/// The per-pair throughput that makes `n` nodes reach `min_busbw`.
pub fn pair_threshold(min_busbw: f64, n: usize) -> f64 {
    if n < 2 || min_busbw <= 0.0 {
        return 0.0;
    }
    min_busbw * n as f64 / (2.0 * (n - 1) as f64)
}

/// One node's checks, judged.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub node: NodeRow,
    pub checks: Vec<Check>,
    pub failed: bool,
    /// The failed checks with value and threshold, or how many passed.
    pub summary: String,
    /// False when the node's agent restarted or left while it was checked: nothing is
    /// concluded about the node then (a restart is not a fault), and a peer's failed pair
    /// with it is not the peer's.
    pub judged: bool,
}

impl Verdict {
    fn from_checks(node: NodeRow, checks: Vec<Check>) -> Self {
        let failures: Vec<String> = checks
            .iter()
            .filter(|c| c.verdict == "fail")
            .map(describe_failure)
            .collect();
        let summary = if failures.is_empty() {
            let count = |v: &str| checks.iter().filter(|c| c.verdict == v).count();
            let mut s = format!("all {} checks passed", count("pass"));
            if count("warn") > 0 {
                s.push_str(&format!(", {} warning(s)", count("warn")));
            }
            if count("not_run") > 0 {
                s.push_str(&format!(", {} not run", count("not_run")));
            }
            s
        } else {
            failures.join("; ")
        };
        Self {
            node,
            failed: checks.iter().any(|c| c.verdict == "fail"),
            checks,
            summary,
            judged: true,
        }
    }

    /// `checks` judged again, the verdict still judged or not as it was.
    fn with_checks(self, checks: Vec<Check>) -> Self {
        let judged = self.judged;
        Self {
            judged,
            ..Self::from_checks(self.node, checks)
        }
    }

    /// A node whose agent restarted or left during the checks: not judged.
    fn unjudged(node: NodeRow, why: &str) -> Self {
        let check = Check {
            name: "agent".into(),
            verdict: "not_run".into(),
            value: "not judged".into(),
            detail: why.to_string(),
            ..Default::default()
        };
        Self {
            summary: format!("not judged: {why}"),
            judged: false,
            ..Self::from_checks(node, vec![check])
        }
    }

    /// A node whose agent could not run the checks fails them, saying why.
    fn no_answer(node: NodeRow, why: &str) -> Self {
        let check = Check {
            name: "agent".into(),
            verdict: "fail".into(),
            // Why, in the value: it is what a quarantine reason quotes.
            value: format!("no report ({})", crate::message_cut::cut(why, 300)),
            threshold: "a report".into(),
            detail: format!("the agent did not run the checks: {why}"),
            ..Default::default()
        };
        Self::from_checks(node, vec![check])
    }
}

/// "xid on GPU-1: 1 XID 79 (threshold 0)": what the quarantine reason carries.
fn describe_failure(c: &Check) -> String {
    let mut s = c.name.clone();
    if !c.gpu_uuid.is_empty() {
        s.push_str(&format!(" on {}", c.gpu_uuid));
    }
    if !c.peer.is_empty() {
        s.push_str(&format!(" to {}", c.peer));
    }
    s.push_str(&format!(": {}", c.value));
    if !c.threshold.is_empty() {
        s.push_str(&format!(" (threshold {})", c.threshold));
    }
    s
}

fn check_from(c: v1::CheckResult) -> Check {
    Check {
        name: c.name,
        gpu_uuid: c.gpu_uuid,
        verdict: c.verdict,
        value: c.value,
        threshold: c.threshold,
        detail: c.detail,
        peer: c.peer,
        gbps: if c.gbps.is_finite() { c.gbps } else { 0.0 },
    }
}

/// The MIG layout the store recorded for each GPU of the node.
fn recorded_layout(conn: &impl AsConn, node_id: &str) -> Result<Vec<v1::GpuLayout>> {
    Ok(crate::recorded::recorded_gpus(conn, node_id)?
        .iter()
        .map(|g| v1::GpuLayout {
            index: g.index,
            whole_gpu: !g.mig_enabled,
            placements: if g.mig_enabled {
                gpufleet_wire::inventory::placements_of(g)
                    .iter()
                    .map(gpufleet_wire::inventory::placement_message)
                    .collect()
            } else {
                Vec::new()
            },
        })
        .collect())
}

/// What one round of checks asks of the nodes.
pub struct Request<'a> {
    pub level: &'a str,
    /// The driver every node must run ("" : not checked).
    pub expected_driver: &'a str,
    /// Whether the agents compare the MIG state with the recorded layout.
    pub check_layout: bool,
    /// A ring bandwidth test (each node sends to the next) with this bus-bandwidth
    /// threshold, when Some and there are at least two nodes.
    pub bandwidth: Option<f64>,
    pub bandwidth_duration: Duration,
}

/// Orders the checks on every node at once and waits for every answer. A node whose
/// agent is unreachable, or that cannot run the checks, gets Err with why. A node whose
/// checks ran out of their own time (the order's deadline, as under heavy load) is
/// checked once more, alone, before it is blamed; its verdict says it was retried.
pub async fn run(
    state: &AppState,
    nodes: &[NodeRow],
    req: &Request<'_>,
) -> Result<Vec<(NodeRow, std::result::Result<Verdict, String>)>> {
    let mut out = run_once(state, nodes, req).await?;
    let late: Vec<usize> = (0..out.len()).filter(|&i| out[i].2.is_some()).collect();
    if late.is_empty() {
        return Ok(out.into_iter().map(|(n, a, _)| (n, a)).collect());
    }
    let again: Vec<NodeRow> = late.iter().map(|&i| out[i].0.clone()).collect();
    // Alone: the ring's other sides are done, so no bandwidth test this time.
    let alone = Request {
        bandwidth: None,
        ..*req
    };
    let retried = run_once(state, &again, &alone).await?;
    for (&i, (_, answer, _)) in late.iter().zip(retried) {
        let first = out[i].2.take().unwrap_or_default();
        out[i].1 = retried_once(answer, &first);
    }
    Ok(out.into_iter().map(|(n, a, _)| (n, a)).collect())
}

/// A second try's answer, saying what the first got.
fn retried_once(
    answer: std::result::Result<Verdict, String>,
    first: &str,
) -> std::result::Result<Verdict, String> {
    let note = format!(
        "retried once; the first try: {}",
        crate::message_cut::cut(first, 300)
    );
    match answer {
        Ok(mut v) => {
            v.summary = format!("{} ({note})", v.summary);
            Ok(v)
        }
        Err(why) => Err(format!("{why} ({note})")),
    }
}

/// One round of [`run`]; with each answer, the error when the node's order passed its
/// deadline.
async fn run_once(
    state: &AppState,
    nodes: &[NodeRow],
    req: &Request<'_>,
) -> Result<
    Vec<(
        NodeRow,
        std::result::Result<Verdict, String>,
        Option<String>,
    )>,
> {
    let n = nodes.len();
    let token = uuid::Uuid::new_v4().simple().to_string();
    let duration_ms = u32::try_from(req.bandwidth_duration.as_millis())
        .unwrap_or(u32::MAX)
        .clamp(50, 60_000);
    // What the orders need from the store, in one read: peers' addresses and layouts.
    let ids: Vec<String> = nodes.iter().map(|n| n.id.clone()).collect();
    let with_layout = req.check_layout;
    let (addrs, layouts) = state
        .read(
            move |conn| -> Result<(Vec<String>, Vec<Vec<v1::GpuLayout>>)> {
                let mut addrs = Vec::with_capacity(ids.len());
                let mut layouts = Vec::with_capacity(ids.len());
                for id in &ids {
                    addrs.push(store::health::bandwidth_addr(conn, id)?);
                    layouts.push(if with_layout {
                        recorded_layout(conn, id)?
                    } else {
                        Vec::new()
                    });
                }
                Ok((addrs, layouts))
            },
        )
        .await?;
    let mut orders = Vec::with_capacity(n);
    // Pairs that cannot be tested (an agent without a listener): said in the node's report.
    let mut untested: Vec<Option<Check>> = vec![None; n];
    for (i, node) in nodes.iter().enumerate() {
        let bandwidth = match req.bandwidth {
            Some(min_busbw) if n >= 2 => {
                let next = (i + 1) % n;
                let min_gbps = pair_threshold(min_busbw, n);
                if addrs[i].is_empty() || addrs[next].is_empty() {
                    let without = if addrs[i].is_empty() {
                        node
                    } else {
                        &nodes[next]
                    };
                    untested[i] = Some(Check {
                        name: "bandwidth".into(),
                        verdict: if min_gbps > 0.0 { "fail" } else { "not_run" }.into(),
                        value: "not measured".into(),
                        threshold: format!("{min_gbps:.2} Gbit/s"),
                        detail: format!(
                            "node {} runs no bandwidth listener, so this pair was not tested",
                            without.hostname
                        ),
                        peer: nodes[next].hostname.clone(),
                        ..Default::default()
                    });
                    None
                } else {
                    Some(v1::BandwidthTest {
                        peers: vec![v1::BandwidthPeer {
                            node: nodes[next].hostname.clone(),
                            addr: addrs[next].clone(),
                        }],
                        duration_ms,
                        token: token.clone(),
                        min_gbps,
                    })
                }
            }
            _ => None,
        };
        let expected_layout = layouts[i].clone();
        // The node's fleet group decides how its load tests are judged (and whether a
        // host that cannot run them may skip them).
        let load = state.delivers.load_tests(&node.gpu_type);
        orders.push(v1::WorkOrder {
            id: uuid::Uuid::new_v4().to_string(),
            epoch: 0, // stamped by Registry::dispatch
            kind: Some(v1::work_order::Kind::RunHealthCheck(v1::RunHealthCheck {
                level: req.level.to_string(),
                expected_driver: req.expected_driver.to_string(),
                expected_layout,
                bandwidth,
                load_min_fraction: load.min_fraction,
                load_skip_allowed: load.skip_allowed,
                burn_seconds: load.burn_seconds,
            })),
        });
    }
    // Every order first, then the waits: the bandwidth test needs all sides at once.
    let sessions: Vec<Option<u64>> = nodes
        .iter()
        .map(|n| state.agents.session_of(&n.id))
        .collect();
    let waits: Vec<_> = nodes
        .iter()
        .zip(orders)
        .map(|(node, order)| state.agents.dispatch(&node.id, order))
        .collect();
    let mut out = Vec::with_capacity(n);
    for (((node, wait), untested), session) in nodes.iter().zip(waits).zip(untested).zip(sessions) {
        let answer = wait.await;
        if session.is_none() || state.agents.session_of(&node.id) != session {
            out.push((
                node.clone(),
                Ok(Verdict::unjudged(
                    node.clone(),
                    "its agent restarted or left during the checks",
                )),
                None,
            ));
            continue;
        }
        let late = match &answer {
            Ok(Outcome::Answered(r)) if r.error_kind == crate::registry::DEADLINE => {
                Some(r.error.clone())
            }
            _ => None,
        };
        let verdict = match answer {
            Ok(Outcome::Answered(r)) if r.ok => match r.health {
                Some(h) => Ok(Verdict::from_checks(
                    node.clone(),
                    h.checks
                        .into_iter()
                        .map(check_from)
                        .chain(untested)
                        .collect(),
                )),
                None => Err("the agent answered without a report".to_string()),
            },
            // Refused as a rule (an agent without health checks, or an order it cannot
            // take): nothing was checked, which is "not run", not a failure of the node.
            Ok(Outcome::Answered(r)) if r.error_kind == "rule" => Ok(Verdict::from_checks(
                node.clone(),
                vec![Check {
                    name: "agent".into(),
                    verdict: "not_run".into(),
                    value: "refused".into(),
                    detail: format!("the agent did not run the checks: {}", r.error),
                    ..Default::default()
                }],
            )),
            // Never sent: this replica cannot stamp an epoch on it. Nothing is learned
            // of the node.
            Ok(Outcome::Answered(r)) if r.error_kind == crate::registry::NO_EPOCH => {
                Ok(Verdict::unjudged(node.clone(), &r.error))
            }
            Ok(Outcome::Answered(r)) => Err(r.error),
            Ok(Outcome::Unreachable(why)) => Err(why),
            Err(_) => Err("the control plane is stopping".to_string()),
        };
        out.push((node.clone(), verdict, late));
    }
    Ok(out)
}

/// Records a node's verdict under `run_id`, as a member of `cluster` when it is one.
async fn record(
    state: &AppState,
    fence: &Fence,
    run_id: &str,
    level: &str,
    cluster: Option<&ClusterRow>,
    v: &Verdict,
) -> Result<()> {
    let row = ResultRow {
        run_id: run_id.to_string(),
        node_id: v.node.id.clone(),
        node: v.node.hostname.clone(),
        cluster_id: cluster.map(|c| c.id.clone()).unwrap_or_default(),
        tenant_id: cluster.map(|c| c.tenant_id.clone()).unwrap_or_default(),
        level: level.to_string(),
        verdict: if v.failed { "failed" } else { "passed" }.into(),
        summary: v.summary.clone(),
        checks: v.checks.clone(),
        action: String::new(),
        finished_at: state.now(),
    };
    for c in v.checks.iter().filter(|c| c.verdict == "fail") {
        crate::counters::check_failed(&v.node.gpu_type, level, &c.name);
    }
    let fence = fence.clone();
    state
        .apply(move |conn| {
            fence.check(conn)?;
            Ok::<_, Error>(store::health::record(conn, &row)?)
        })
        .await
}

/// What a failed verdict is counted as when it takes its node out: its first failed
/// check's name.
fn cause_of(v: &Verdict) -> &str {
    v.checks
        .iter()
        .find(|c| c.verdict == "fail")
        .map_or("unknown", |c| c.name.as_str())
}

async fn set_action(state: &AppState, fence: &Fence, run_id: &str, node_id: &str, action: &str) {
    let (run, node, what) = (run_id.to_string(), node_id.to_string(), action.to_string());
    let fence = fence.clone();
    let recorded = state
        .apply(move |conn| {
            fence.check(conn)?;
            Ok::<_, Error>(store::health::set_action(conn, &run, &node, &what)?)
        })
        .await;
    if let Err(e) = recorded {
        tracing::error!(node = %node_id, error = %e, "cannot record what was done about a check");
    }
}

/// The state reason of a node that failed checks: the failed checks with their values
/// and thresholds.
pub fn quarantine_reason(level: &str, v: &Verdict) -> String {
    format!("failed health checks ({level}): {}", v.summary)
}

/// An event about a node outside any cluster: logged under the node's id.
async fn node_event(state: &AppState, fence: &Fence, node: &NodeRow, kind: &str, message: &str) {
    log_event(state, fence, node.id.clone(), node, kind, message).await;
}

/// Records an event about `node` in the log of `object`; a failure is logged, not raised
/// (the check's outcome stands either way).
async fn log_event(
    state: &AppState,
    fence: &Fence,
    object: String,
    node: &NodeRow,
    kind: &str,
    message: &str,
) {
    let (host, kind, text) = (node.hostname.clone(), kind.to_string(), message.to_string());
    let (clock_now, fence) = (state.now(), fence.clone());
    let recorded = state
        .apply(move |conn| {
            fence.check(conn)?;
            Ok::<_, Error>(store::events::record(
                conn, clock_now, &object, "", &kind, &host, &text,
            )?)
        })
        .await;
    if let Err(e) = recorded {
        tracing::error!(node = %node.hostname, error = %e, "cannot record an event");
    }
}

/// Whether an automatic quarantine goes through the model's breaker (a failed check the
/// control plane ran by itself or for a tenant) or not (an operator's return).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taking {
    Automatic,
    Operator,
    /// The node's host cannot take a tenant's work at all (its agent says so).
    Host,
}

/// What a failed check did to its node.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TakenOut {
    Quarantined,
    /// Left in service by the open breaker, saying so.
    Held(String),
}

/// Quarantines `node` after a failed check (out of `cluster` when it is a member), unless
/// the model's breaker holds it back; the decision and the write are one transaction.
/// Records the events: `node_quarantined`, or `quarantine_held` (and `breaker_opened`
/// in the breaker's log, `breaker/<model>`, when this failure opened it).
async fn quarantine_checked(
    state: &AppState,
    fence: &Fence,
    cluster: Option<&ClusterRow>,
    node: &NodeRow,
    why: &str,
    cause: &str,
    taking: Taking,
) -> Result<TakenOut> {
    let settings = state.breaker.clone();
    let (n, reason, f) = (node.clone(), why.to_string(), fence.clone());
    let now = state.now();
    let (decision, free) = state
        .apply(move |conn| quarantine_in(conn, &f, &settings, &n, &reason, taking, now))
        .await?;
    let (kind, text, outcome) = match decision {
        breaker::Decision::Quarantine => {
            tracing::warn!(node = %node.hostname, %why, "node quarantined");
            crate::counters::quarantine(&node.gpu_type, cause);
            ("node_quarantined", why.to_string(), TakenOut::Quarantined)
        }
        breaker::Decision::Candidate => {
            tracing::warn!(node = %node.hostname, %why, "candidate node quarantined (not counted by the breaker)");
            crate::counters::quarantine(&node.gpu_type, cause);
            (
                "node_quarantined",
                format!("{why}; a candidate (never in service), so the breaker does not count it"),
                TakenOut::Quarantined,
            )
        }
        breaker::Decision::Held { why: held, opened } => {
            if opened {
                tracing::error!(gpu_type = %node.gpu_type, node = %node.hostname, %held, "automatic-quarantine breaker opened");
                breaker_event(state, fence, node, "breaker_opened", &held).await;
            } else {
                tracing::warn!(node = %node.hostname, %held, "quarantine held by the open breaker");
            }
            breaker_event(
                state,
                fence,
                node,
                "quarantine_held",
                &format!("{why}; {held}"),
            )
            .await;
            if free {
                crate::counters::quarantine(&node.gpu_type, cause);
                (
                    "node_quarantined",
                    format!(
                        "{why}; the breaker is open, but a free node that failed is not handed out"
                    ),
                    TakenOut::Quarantined,
                )
            } else {
                (
                    "quarantine_held",
                    format!("{why}; {held}"),
                    TakenOut::Held(held),
                )
            }
        }
    };
    match cluster {
        Some(c) => {
            drivers::event(state, fence, c, kind, &node.hostname, &text).await;
            // The node's own log says whose work it was taken from, so that the fleet's
            // stream traces it to the cluster and tenant even once that cluster is gone.
            let traced = format!("{text} (in cluster {} of tenant {})", c.name, c.tenant_id);
            node_event(state, fence, node, kind, &traced).await;
        }
        None => node_event(state, fence, node, kind, &text).await,
    }
    Ok(outcome)
}

/// [`quarantine_checked`]'s transaction: the breaker's decision and the quarantine, after
/// the fence (a singleton's check writes nothing once its replica lost the lease). Whether
/// the node was free.
fn quarantine_in(
    conn: &impl AsConn,
    fence: &Fence,
    settings: &breaker::Settings,
    n: &NodeRow,
    reason: &str,
    taking: Taking,
    now: i64,
) -> Result<(breaker::Decision, bool)> {
    fence.check(conn)?;
    let d = match taking {
        Taking::Automatic => breaker::decide(conn, settings, n, now)?,
        Taking::Operator | Taking::Host => breaker::Decision::Quarantine,
    };
    // A free node that failed is never handed out, breaker or not: the breaker keeps
    // failed nodes in their clusters, not in the pool.
    let free = store::nodes::get(conn, &n.id)?.is_some_and(|n| n.cluster_id.is_none());
    if !matches!(d, breaker::Decision::Held { .. }) || free {
        store::nodes::set_state(conn, &n.id, NODE_QUARANTINED, reason, now)?;
        store::nodes::release(conn, &n.id, now)?;
    }
    Ok((d, free))
}

/// `cause` of a quarantine (the quarantines counter's label) of a node whose host cannot
/// isolate a tenant's cluster.
const CAUSE_ISOLATION: &str = "isolation";

/// Why a node whose host cannot isolate a tenant's cluster is quarantined.
pub fn unfit_reason(isolation_problem: &str) -> String {
    format!("this host cannot isolate a tenant's cluster: {isolation_problem}; fix the host, restart its agent, then return the node")
}

/// A node whose agent registered saying its host cannot isolate a tenant's cluster:
/// quarantined at once (not through the breaker: a fact of the host, not a failed
/// check), out of its cluster if it was in one, so that no cluster is placed on it.
async fn quarantine_unfit(state: &AppState, node: &NodeRow, isolation_problem: &str) -> Result<()> {
    let cluster = cluster_of(state, node).await?;
    quarantine_checked(
        state,
        &Fence::request(),
        cluster.as_ref(),
        node,
        &unfit_reason(isolation_problem),
        CAUSE_ISOLATION,
        Taking::Host,
    )
    .await?;
    Ok(())
}

/// A node that let an order pass its deadline: quarantined (through the model's
/// breaker) with why, out of its cluster; the change that waited has failed already.
/// `fence`: the heartbeat watch's (a singleton) when it finds the order late.
pub async fn quarantine_unanswered(
    state: &AppState,
    fence: &Fence,
    node_id: &str,
    why: &str,
) -> Result<()> {
    let Some(node) = node_row(state, node_id).await? else {
        return Ok(());
    };
    if node.state == NODE_QUARANTINED {
        return Ok(());
    }
    let cluster = cluster_of(state, &node).await?;
    quarantine_checked(
        state,
        fence,
        cluster.as_ref(),
        &node,
        why,
        crate::counters::CAUSE_DEADLINE,
        Taking::Automatic,
    )
    .await?;
    Ok(())
}

/// An event in the breaker's log of the node's model (`breaker/<model>`, the admin's).
async fn breaker_event(state: &AppState, fence: &Fence, node: &NodeRow, kind: &str, message: &str) {
    log_event(
        state,
        fence,
        breaker::event_object(&node.gpu_type),
        node,
        kind,
        message,
    )
    .await;
}

/// A failed node of `cluster`: quarantined (out of the cluster, named in `quarantined`)
/// and replaced from the same source. Returns the replacement, or why there is none (or
/// why the breaker left the node in service).
async fn quarantine_and_replace(
    state: &AppState,
    fence: &Fence,
    cluster: &ClusterRow,
    run_id: &str,
    level: &str,
    v: &Verdict,
    quarantined: &mut Vec<String>,
) -> std::result::Result<String, String> {
    let why = quarantine_reason(level, v);
    drivers::event(
        state,
        fence,
        cluster,
        "check_failed",
        &v.node.hostname,
        &why,
    )
    .await;
    match quarantine_checked(
        state,
        fence,
        Some(cluster),
        &v.node,
        &why,
        cause_of(v),
        Taking::Automatic,
    )
    .await
    {
        Err(e) => return Err(format!("cannot quarantine {}: {e}", v.node.hostname)),
        Ok(TakenOut::Held(held)) => {
            set_action(
                state,
                fence,
                run_id,
                &v.node.id,
                "left in service: the breaker is open",
            )
            .await;
            return Err(format!(
                "node {} failed {level} checks ({}); {held}",
                v.node.hostname, v.summary
            ));
        }
        Ok(TakenOut::Quarantined) => quarantined.push(v.node.hostname.clone()),
    }
    match drivers::replace(state, fence, cluster, &v.node.hostname).await {
        Ok(new) => {
            set_action(
                state,
                fence,
                run_id,
                &v.node.id,
                &format!("quarantined; replaced by {new}"),
            )
            .await;
            Ok(new)
        }
        Err(e) => {
            set_action(
                state,
                fence,
                run_id,
                &v.node.id,
                "quarantined; no replacement",
            )
            .await;
            Err(format!(
                "node {} failed {level} checks ({}) and was quarantined; no replacement: {e}",
                v.node.hostname, v.summary
            ))
        }
    }
}

/// "a; b; quarantined: n1, n2": a failed run's problems, naming every node it quarantined.
pub fn problems_text(problems: &[String], quarantined: &[String]) -> String {
    let mut text = problems.join("; ");
    if !quarantined.is_empty() {
        text.push_str(&format!("; quarantined: {}", quarantined.join(", ")));
    }
    text
}

/// The outcome of checking a cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterRun {
    pub run_id: String,
    /// Failed nodes that could not be replaced (empty: every node passed in the end).
    pub problems: Vec<String>,
    /// Every node the run quarantined, by name (replaced or not).
    pub quarantined: Vec<String>,
    pub alg_bandwidth_gbps: f64,
    pub bus_bandwidth_gbps: f64,
}

/// Checks every node of `cluster` at `level` with a ring bandwidth test among them;
/// failed nodes are quarantined and replaced and the cluster checked again, until every
/// node passes or no replacement is left. Records results and the cluster's acceptance
/// status. With `joining` (a scale-up's new nodes), a slow pair between a node already
/// in service and a joining one is the joining node's: the nodes that were fine stay.
pub async fn check_cluster(
    state: &AppState,
    fence: &Fence,
    cluster: &ClusterRow,
    level: &str,
    expected_driver: &str,
    bandwidth_duration: Duration,
    joining: &[NodeRow],
) -> Result<ClusterRun> {
    let mut acceptance = acceptance_of(state, &cluster.id).await?;
    let run_id = uuid::Uuid::new_v4().to_string();
    acceptance.status = "running".into();
    acceptance.run_id = run_id.clone();
    acceptance.run_level = level.to_string();
    let (running, f) = (acceptance.clone(), fence.clone());
    state
        .apply(move |conn| {
            f.check(conn)?;
            Ok::<_, Error>(store::health::put_acceptance(conn, &running)?)
        })
        .await?;
    let mut outcome = ClusterRun {
        run_id: run_id.clone(),
        ..Default::default()
    };
    let mut passed = false;
    for _round in 0..MAX_ROUNDS {
        let nodes = nodes_of(state, &cluster.id).await?;
        let req = Request {
            level,
            expected_driver,
            check_layout: true,
            bandwidth: Some(acceptance.min_bus_bandwidth_gbps),
            bandwidth_duration,
        };
        // Progress: what a caller whose deadline fires is waiting on (one commit for all).
        let checking = format!("acceptance checks ({level}) running");
        let progress = nodes
            .iter()
            .map(|n| super::drivers::Event::new("acceptance_checking", &n.hostname, &checking))
            .collect();
        super::drivers::events(state, fence, cluster, progress).await;
        let answers = attribute_bandwidth(run(state, &nodes, &req).await?);
        let answers = excuse_unjudged(blame_joining(answers, joining));
        for v in &answers {
            record(state, fence, &run_id, level, Some(cluster), v).await?;
        }
        let gbps: Vec<f64> = answers
            .iter()
            .flat_map(|v| v.checks.iter())
            .filter(|c| c.name == "bandwidth" && c.verdict != "not_run")
            .map(|c| c.gbps)
            .collect();
        outcome.alg_bandwidth_gbps = gbps.iter().copied().fold(f64::INFINITY, f64::min);
        if !outcome.alg_bandwidth_gbps.is_finite() {
            outcome.alg_bandwidth_gbps = 0.0;
        }
        outcome.bus_bandwidth_gbps = bus_bandwidth(outcome.alg_bandwidth_gbps, nodes.len());
        // A node whose agent restarted during the checks is not judged: the change it
        // was checked for fails (and is undone), the node stays in service.
        for v in answers.iter().filter(|v| !v.judged) {
            outcome
                .problems
                .push(format!("node {}: {}", v.node.hostname, v.summary));
        }
        let failed: Vec<&Verdict> = answers.iter().filter(|v| v.failed).collect();
        if failed.is_empty() && outcome.problems.is_empty() {
            passed = true;
            break;
        }
        // No pair connected at all: the nodes' advertised addresses (a loopback one
        // offered to other hosts) or the network, named as such; no node is taken out.
        if let Some(pairs) = unreachable_everywhere(&answers) {
            let shown: Vec<&str> = pairs.iter().take(4).map(String::as_str).collect();
            outcome.problems.push(format!(
                "acceptance: no node of the cluster could reach a peer's bandwidth-test listener ({}{}); the addresses the nodes' agents advertise are not reachable from the other nodes (see gpufleet-agent node --bandwidth-listen and --bandwidth-advertise), so no node was taken out of service",
                shown.join("; "),
                if pairs.len() > shown.len() { "; ..." } else { "" }
            ));
            break;
        }
        // Every pair short and nothing else wrong: the fleet does not deliver what was
        // asked, which no node is to blame for. Taking nodes out would empty the pool.
        if let Some(fastest) = short_everywhere(&answers) {
            outcome.problems.push(format!(
                "acceptance.min_bus_bandwidth_gbps: no pair of the cluster's {} nodes reaches {} Gbit/s of bus bandwidth (the fastest: {:.1}); the threshold is above what this fleet delivers, so no node was taken out of service",
                nodes.len(),
                acceptance.min_bus_bandwidth_gbps,
                bus_bandwidth(fastest, nodes.len()),
            ));
            break;
        }
        for v in failed {
            match quarantine_and_replace(
                state,
                fence,
                cluster,
                &run_id,
                level,
                v,
                &mut outcome.quarantined,
            )
            .await
            {
                Ok(new) => tracing::info!(node = %v.node.hostname, %new, "failed node replaced"),
                Err(problem) => outcome.problems.push(problem),
            }
        }
        if !outcome.problems.is_empty() {
            break;
        }
    }
    if !passed && outcome.problems.is_empty() {
        outcome.problems.push(format!(
            "nodes still failed {level} checks after {MAX_ROUNDS} rounds of replacements"
        ));
    }
    acceptance.status = if passed { "passed" } else { "failed" }.into();
    acceptance.checked_at = state.now();
    acceptance.alg_bandwidth_gbps = outcome.alg_bandwidth_gbps;
    acceptance.bus_bandwidth_gbps = outcome.bus_bandwidth_gbps;
    let (id, f) = (cluster.id.clone(), fence.clone());
    state
        .apply(move |conn| -> Result<()> {
            f.check(conn)?;
            // The cluster may be gone meanwhile (a failed create is undone by its caller).
            let fresh = store::health::acceptance(conn, &id)?;
            acceptance.level = fresh.level;
            acceptance.min_bus_bandwidth_gbps = fresh.min_bus_bandwidth_gbps;
            acceptance.run_on_create = fresh.run_on_create;
            store::health::put_acceptance(conn, &acceptance)?;
            Ok(())
        })
        .await?;
    Ok(outcome)
}

/// A scale-up's ring test: a failed pair of a node already in service whose other end is
/// joining becomes a warning naming that end (a 2-node ring cannot tell which end is
/// slow, and the node in service passed before). Without joining nodes, unchanged.
fn blame_joining(answers: Vec<Verdict>, joining: &[NodeRow]) -> Vec<Verdict> {
    if joining.is_empty() {
        return answers;
    }
    let is_joining = |host: &str| joining.iter().any(|n| n.hostname == host);
    answers
        .into_iter()
        .map(|mut v| {
            if is_joining(&v.node.hostname) {
                return v;
            }
            let checks = std::mem::take(&mut v.checks)
                .into_iter()
                .map(|mut c| {
                    if c.name == "bandwidth" && c.verdict == "fail" && is_joining(&c.peer) {
                        c.verdict = "warn".into();
                        c.detail =
                            format!("{} (attributed to {}, which is joining)", c.detail, c.peer);
                    }
                    c
                })
                .collect();
            v.with_checks(checks)
        })
        .collect()
}

/// A failed pair with a node that was not judged (its agent restarted or left during the
/// test) becomes a warning: the sender measured a peer that was not there.
fn excuse_unjudged(answers: Vec<Verdict>) -> Vec<Verdict> {
    let gone: Vec<String> = answers
        .iter()
        .filter(|v| !v.judged)
        .map(|v| v.node.hostname.clone())
        .collect();
    if gone.is_empty() {
        return answers;
    }
    answers
        .into_iter()
        .map(|mut v| {
            if !v.judged {
                return v;
            }
            let checks = std::mem::take(&mut v.checks)
                .into_iter()
                .map(|mut c| {
                    if c.name == "bandwidth" && c.verdict == "fail" && gone.contains(&c.peer) {
                        c.verdict = "warn".into();
                        c.detail = format!(
                            "{} (its peer {} was not there: its agent restarted or left)",
                            c.detail, c.peer
                        );
                    }
                    c
                })
                .collect();
            v.with_checks(checks)
        })
        .collect()
}

/// The (sender, pair) of every ring-test pair that ran, when no node failed anything but
/// its pairs; None when a node failed another check or no pair was tested. What the
/// pairs say together is then about the ring, not about a node.
fn ring_pairs_alone(answers: &[Verdict]) -> Option<Vec<(&Verdict, &Check)>> {
    let pairs: Vec<(&Verdict, &Check)> = answers
        .iter()
        .flat_map(|v| v.checks.iter().map(move |c| (v, c)))
        .filter(|(_, c)| c.name == "bandwidth" && c.verdict != "not_run")
        .collect();
    let only_bandwidth = answers.iter().all(|v| {
        v.checks
            .iter()
            .all(|c| c.verdict != "fail" || c.name == "bandwidth")
    });
    (!pairs.is_empty() && only_bandwidth).then_some(pairs)
}

/// When no pair of a ring test could connect to its peer (and nothing else failed):
/// the pairs, as their senders described them. That is the addresses the nodes advertise
/// or the network between them, not a node, and not a threshold (see [`short_everywhere`]).
pub fn unreachable_everywhere(answers: &[Verdict]) -> Option<Vec<String>> {
    let pairs = ring_pairs_alone(answers)?;
    pairs.iter().all(|(_, c)| c.value == NO_DATA).then(|| {
        pairs
            .iter()
            .map(|(v, c)| format!("{} {}", v.node.hostname, c.detail))
            .collect()
    })
}

/// The fastest pair's algorithm bandwidth when every pair of a ring test fell short and
/// no node failed anything else: a result about the threshold, not about the hardware.
/// None when some pair passed, a node failed another check, or no pair was tested.
pub fn short_everywhere(answers: &[Verdict]) -> Option<f64> {
    let pairs = ring_pairs_alone(answers)?;
    pairs
        .iter()
        .all(|(_, c)| c.verdict == "fail")
        .then(|| pairs.iter().map(|(_, c)| c.gbps).fold(0.0, f64::max))
}

/// Each sender reports its own pair, but a slow pair may be the receiver's fault. In the
/// ring, a slow node slows both its pairs: a node both of whose pairs failed is blamed
/// for them, and the neighbour that reported one is not (its check becomes a warning
/// that names the blamed peer). A failed pair with neither end so blamed stays the
/// sender's. Answers without a report fail as nodes (see [`Verdict::no_answer`]).
pub fn attribute_bandwidth(
    answers: Vec<(NodeRow, std::result::Result<Verdict, String>)>,
) -> Vec<Verdict> {
    let verdicts: Vec<Verdict> = answers
        .into_iter()
        .map(|(node, a)| a.unwrap_or_else(|why| Verdict::no_answer(node, &why)))
        .collect();
    // (sender, receiver) of every failed pair.
    let failed: Vec<(String, String)> = verdicts
        .iter()
        .flat_map(|v| {
            v.checks
                .iter()
                .filter(|c| c.name == "bandwidth" && c.verdict == "fail" && !c.peer.is_empty())
                .map(|c| (v.node.hostname.clone(), c.peer.clone()))
        })
        .collect();
    let touching = |host: &str| {
        failed
            .iter()
            .filter(|(s, r)| s == host || r == host)
            .count()
    };
    let blamed: Vec<String> = verdicts
        .iter()
        .map(|v| v.node.hostname.clone())
        .filter(|h| touching(h) >= 2)
        .collect();
    verdicts
        .into_iter()
        .map(|mut v| {
            if blamed.contains(&v.node.hostname) {
                return v;
            }
            let mut changed = false;
            let checks: Vec<Check> = std::mem::take(&mut v.checks)
                .into_iter()
                .map(|mut c| {
                    if c.name == "bandwidth" && c.verdict == "fail" && blamed.contains(&c.peer) {
                        c.verdict = "warn".into();
                        c.detail = format!(
                            "{} (attributed to {}, slow on both of its pairs)",
                            c.detail, c.peer
                        );
                        changed = true;
                    }
                    c
                })
                .collect();
            if changed {
                v.with_checks(checks)
            } else {
                Verdict { checks, ..v }
            }
        })
        .collect()
}

/// `run`, with every node's verdict recorded; a node without an answer fails.
async fn run_checks_recorded(
    state: &AppState,
    fence: &Fence,
    nodes: &[NodeRow],
    req: &Request<'_>,
    run_id: &str,
    cluster: Option<&ClusterRow>,
) -> Result<Vec<Verdict>> {
    let mut out = Vec::new();
    for (node, answer) in run(state, nodes, req).await? {
        let v = answer.unwrap_or_else(|why| Verdict::no_answer(node, &why));
        record(state, fence, run_id, req.level, cluster, &v).await?;
        out.push(v);
    }
    Ok(out)
}

/// After a cluster's new nodes have their driver and layout (`bring_up`): its acceptance
/// checks, unless it asked not to run them. A create whose failed nodes cannot all be
/// replaced fails (its nodes back to whole GPUs; the caller undoes the rest); an update
/// leaves the cluster `degraded` with the reason. `fence`: a refill's (a singleton) or a
/// request's.
pub async fn accept_new_nodes(
    state: &AppState,
    fence: &Fence,
    cluster: &ClusterRow,
    joining: &[NodeRow],
) -> Result<()> {
    let acceptance = acceptance_of(state, &cluster.id).await?;
    if joining.is_empty() || !acceptance.run_on_create {
        return Ok(());
    }
    // A create's nodes all run the cluster's driver by now; an update's existing nodes
    // get a new driver only in the roll after this (which verifies it itself).
    let driver = if cluster.status == "creating" {
        cluster.driver_version.as_str()
    } else {
        ""
    };
    let run = check_cluster(
        state,
        fence,
        cluster,
        &acceptance.level,
        driver,
        state.health.bandwidth_duration,
        if cluster.status == "creating" {
            &[]
        } else {
            joining
        },
    )
    .await?;
    if run.problems.is_empty() {
        return Ok(());
    }
    let reason = format!(
        "acceptance ({}): {}",
        acceptance.level,
        problems_text(&run.problems, &run.quarantined)
    );
    if cluster.status == "creating" {
        // The create is taken back: its remaining nodes return to whole GPUs first.
        let (id, gpu_type, layout) = (
            cluster.id.clone(),
            cluster.gpu_type.clone(),
            cluster.mig_layout.clone(),
        );
        let changes = state
            .read(move |conn| {
                let held = store::nodes::list(conn, None, Some(&id))?;
                crate::mig::changes(conn, &gpu_type, &[], &layout, &held)
            })
            .await?;
        if let Err(e) = crate::mig::converge(state, &changes).await {
            tracing::warn!(cluster = %cluster.name, error = %e, "cannot reset the nodes of a failed create");
        }
        return Err(Error::Aborted(format!(
            "{reason}; the cluster was not created"
        )));
    }
    // An update that cannot reach what was asked fails; its caller puts the cluster back
    // as it was, with the nodes that were in service and passed.
    Err(Error::Aborted(format!(
        "node_count: {reason}; the cluster keeps the nodes it had"
    )))
}

/// A tenant's (or the admin's) check of a cluster now: failed nodes are quarantined and
/// replaced; without a replacement the cluster becomes `degraded` with the reason.
pub async fn check_now(
    state: &AppState,
    cluster: &ClusterRow,
    level: &str,
    bandwidth_duration: Duration,
) -> Result<ClusterRun> {
    // A tenant's or the admin's request: not fenced.
    let fence = Fence::request();
    let run = check_cluster(
        state,
        &fence,
        cluster,
        level,
        &cluster.driver_version,
        bandwidth_duration,
        &[],
    )
    .await?;
    if !run.problems.is_empty() {
        let reason = format!(
            "health checks ({level}): {}",
            problems_text(&run.problems, &run.quarantined)
        );
        set_status(state, &fence, &cluster.id, "degraded", &reason).await?;
    }
    Ok(run)
}

/// One node checked alone at `level` (registration, return, periodic). Returns None when
/// its agent gave no report (unreachable, stopping): nothing is concluded then.
/// A failed one is taken out (see [`take_out`]); `taken_out` says whether it was.
async fn check_one(
    state: &AppState,
    fence: &Fence,
    node: &NodeRow,
    level: &str,
    taking: Taking,
) -> Result<Option<Checked>> {
    let cluster = cluster_of(state, node).await?;
    let mut node = node.clone();
    let mut attempt = 0;
    let v = loop {
        attempt += 1;
        // The driver the control plane recorded for the node (a cluster's may be rolling
        // through its nodes; each node's own record is what it should run now).
        let req = Request {
            level,
            expected_driver: &node.driver_version,
            check_layout: true,
            bandwidth: None,
            bandwidth_duration: Duration::ZERO,
        };
        let layout_before = layout_of(state, &node.id).await?;
        let Some((_, answer)) = run(state, std::slice::from_ref(&node), &req).await?.pop() else {
            return Ok(None);
        };
        let v = match answer {
            Ok(v) if !v.judged => {
                tracing::info!(node = %node.hostname, "not judged: its agent restarted or left during the check");
                return Ok(None);
            }
            Ok(v) => v,
            Err(why) if !state.agents.is_live(&node.id) => {
                tracing::warn!(node = %node.hostname, %why, "no health report");
                return Ok(None);
            }
            Err(why) => Verdict::no_answer(node.clone(), &why),
        };
        // A driver or layout order that ran while the node was checked (a roll that went
        // on after its agent restarted, a change carried forward) changes what it should
        // run: check it against that, rather than quarantine a node for running what it
        // was just told to.
        if v.failed && attempt < RECHECKS && only_changeable_failed(&v) {
            if let Some(now) = node_row(state, &node.id).await? {
                let layout_now = layout_of(state, &node.id).await?;
                if now.driver_version != node.driver_version || layout_now != layout_before {
                    tracing::info!(node = %node.hostname, driver = %now.driver_version, "driver or layout changed during the check; checking again");
                    node = now;
                    continue;
                }
            }
        }
        break v;
    };
    let run_id = uuid::Uuid::new_v4().to_string();
    record(state, fence, &run_id, level, cluster.as_ref(), &v).await?;
    let taken_out = if v.failed {
        take_out(state, fence, cluster.as_ref(), &run_id, level, &v, taking).await?
    } else {
        false
    };
    Ok(Some(Checked {
        verdict: v,
        taken_out,
    }))
}

/// One node's verdict, and whether a failure took it out of service.
#[derive(Debug, Clone)]
struct Checked {
    verdict: Verdict,
    taken_out: bool,
}

/// How many times one node's check may start again because its driver or layout record changed.
const RECHECKS: u32 = 3;

/// Whether only checks of what orders change (the driver, the MIG layout) failed.
fn only_changeable_failed(v: &Verdict) -> bool {
    let mut failed = v.checks.iter().filter(|c| c.verdict == "fail").peekable();
    failed.peek().is_some() && failed.all(|c| c.name == "driver" || c.name == "mig_layout")
}

/// The MIG layout recorded for the node now.
async fn layout_of(state: &AppState, node_id: &str) -> Result<Vec<v1::GpuLayout>> {
    let id = node_id.to_string();
    state.read(move |conn| recorded_layout(conn, &id)).await
}

/// A node that failed alone: quarantined; out of its cluster and replaced when it was a
/// member (the cluster degraded, with why, when no replacement is left). An automatic
/// one the model's breaker holds back stays in service (its cluster degraded, saying
/// so). Returns whether the node was taken out.
async fn take_out(
    state: &AppState,
    fence: &Fence,
    cluster: Option<&ClusterRow>,
    run_id: &str,
    level: &str,
    v: &Verdict,
    taking: Taking,
) -> Result<bool> {
    let why = quarantine_reason(level, v);
    let Some(cluster) = cluster else {
        node_event(state, fence, &v.node, "check_failed", &why).await;
        return Ok(
            match quarantine_checked(state, fence, None, &v.node, &why, cause_of(v), taking).await?
            {
                TakenOut::Quarantined => {
                    set_action(state, fence, run_id, &v.node.id, "quarantined").await;
                    true
                }
                TakenOut::Held(_) => {
                    set_action(
                        state,
                        fence,
                        run_id,
                        &v.node.id,
                        "left in service: the breaker is open",
                    )
                    .await;
                    false
                }
            },
        );
    };
    let mut failed = v.clone();
    let mut quarantined = Vec::new();
    loop {
        match quarantine_and_replace(
            state,
            fence,
            cluster,
            run_id,
            level,
            &failed,
            &mut quarantined,
        )
        .await
        {
            Err(problem) => {
                let reason = problems_text(&[problem], &quarantined);
                set_status(state, fence, &cluster.id, "degraded", &reason).await?;
                return Ok(!quarantined.is_empty());
            }
            Ok(new) => {
                // The replacement is checked before it counts.
                let Some(node) = state
                    .read(move |conn| Ok::<_, Error>(store::nodes::by_hostname(conn, &new)?))
                    .await?
                else {
                    return Ok(true);
                };
                let req = Request {
                    level,
                    expected_driver: &cluster.driver_version,
                    check_layout: true,
                    bandwidth: None,
                    bandwidth_duration: Duration::ZERO,
                };
                let checked = run_checks_recorded(
                    state,
                    fence,
                    std::slice::from_ref(&node),
                    &req,
                    run_id,
                    Some(cluster),
                )
                .await?;
                match checked.into_iter().next() {
                    Some(v) if v.failed => failed = v,
                    _ => return Ok(true),
                }
            }
        }
    }
}

/// After a node registers: it is brought to the layout the control plane recorded for it
/// first (a restart in the middle of a MIG change leaves a node half-way: that is a
/// change to finish, not a fault), then it runs the medium checks, and (passed) it is
/// ready; failed, it is quarantined with the failed checks as the reason. A quarantined
/// node stays so: only an operator's return checks it again.
pub async fn admit_registered(
    state: Arc<AppState>,
    node_id: String,
    bandwidth_addr: String,
    kept_slurm: Vec<String>,
    isolation_problem: String,
) {
    let admitted = admit(
        &state,
        &node_id,
        &bandwidth_addr,
        &kept_slurm,
        &isolation_problem,
    );
    if let Err(e) = admitted.await {
        tracing::error!(node = %node_id, error = %e, "cannot check the registered node");
    }
}

async fn admit(
    state: &Arc<AppState>,
    node_id: &str,
    bandwidth_addr: &str,
    kept_slurm: &[String],
    isolation_problem: &str,
) -> Result<()> {
    let (id, addr) = (node_id.to_string(), bandwidth_addr.to_string());
    let node = state
        .apply(move |conn| -> Result<Option<NodeRow>> {
            store::health::set_bandwidth_addr(conn, &id, &addr)?;
            Ok(store::nodes::get(conn, &id)?)
        })
        .await?;
    let Some(node) = node else { return Ok(()) };
    // Nothing of a cluster the node no longer belongs to (it was replaced while its agent
    // was away) runs on it again: those daemons are stopped and their keys removed first.
    let own = node.cluster_id.as_deref().map(gpufleet_slurm::cluster_name);
    let (mine, foreign): (Vec<String>, Vec<String>) = kept_slurm
        .iter()
        .cloned()
        .partition(|c| Some(c) == own.as_ref());
    crate::slurm_clusters::stop_kept(state, &node, &foreign).await;
    if !isolation_problem.is_empty() && node.state != NODE_QUARANTINED {
        quarantine_unfit(state, &node, isolation_problem).await?;
    }
    if node.state == NODE_QUARANTINED || !isolation_problem.is_empty() {
        crate::slurm_clusters::stop_kept(state, &node, &mine).await;
        crate::mig::reconcile_node(state.clone(), Fence::request(), node_id.to_string()).await;
        return Ok(());
    }
    let Some((_, not_there)) = crate::mig::bring_to_recorded(state, node_id, false).await else {
        return Ok(());
    };
    if !not_there.is_empty() {
        // Busy with why; the heartbeat watch tries again.
        crate::mig::mark_reconciled(state, &Fence::request(), node, not_there).await;
        return Ok(());
    }
    // A node that gave no report (its agent went away) stays busy: it is never ready
    // without a live agent and a passed check; the heartbeat watch takes it from there.
    if checked_and_passed(
        state,
        &node,
        "acceptance checks (medium)",
        Taking::Automatic,
    )
    .await?
        == Some(true)
    {
        // Passed the platform's own checks: from now on a node in service (a candidate
        // that failed was quarantined, uncounted, by `quarantine_checked`).
        let (id, now) = (node.id.clone(), state.now());
        state
            .apply(move |conn| Ok::<_, Error>(store::nodes::put_in_service(conn, &id, now)?))
            .await?;
        crate::mig::mark_reconciled(state, &Fence::request(), node.clone(), String::new()).await;
        crate::slurm_clusters::rejoin(state, &node).await;
    } else if node_row(state, node_id)
        .await?
        .is_some_and(|n| n.cluster_id != node.cluster_id)
    {
        // Taken out of its cluster by its checks: its kept daemons go too.
        crate::slurm_clusters::stop_kept(state, &node, &mine).await;
    }
    Ok(())
}

/// Marks the node busy with `reason` while it runs the medium checks. Some(true) when it
/// passed, or failed and the open breaker left it in service; None when its agent gave
/// no report (it went away).
async fn checked_and_passed(
    state: &AppState,
    node: &NodeRow,
    reason: &str,
    taking: Taking,
) -> Result<Option<bool>> {
    drivers::set_node_state(state, &node.id, NODE_BUSY, reason).await?;
    // A registration's or an operator's return: not a singleton's, not fenced.
    Ok(
        check_one(state, &Fence::request(), node, ADMISSION_LEVEL, taking)
            .await?
            .map(|c| !c.verdict.failed || !c.taken_out),
    )
}

/// An operator returns a quarantined node: it runs the medium checks first and stays
/// quarantined (with the new reason) when it fails them; passed, its agent resets it
/// and it becomes ready.
pub async fn return_checked(state: Arc<AppState>, node_id: &str) -> Result<()> {
    let node = node_row(&state, node_id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("node '{node_id}' not found")))?;
    if let Some(problem) = state.agents.isolation_problem(node_id) {
        return Err(Error::Precondition(format!(
            "name: node {} stays quarantined: {}",
            node.hostname,
            unfit_reason(&problem)
        )));
    }
    let passed = checked_and_passed(
        &state,
        &node,
        "returned by an operator; acceptance checks (medium)",
        Taking::Operator,
    )
    .await?;
    let Some(passed) = passed else {
        // Nothing was learned: the node stays as it was.
        drivers::set_node_state(&state, node_id, NODE_QUARANTINED, &node.state_reason).await?;
        return Err(Error::Unavailable(format!(
            "name: node {} gave no check report (its agent is not connected); it stays quarantined",
            node.hostname
        )));
    };
    if !passed {
        let reason = node_row(&state, node_id)
            .await?
            .map(|n| n.state_reason)
            .unwrap_or_default();
        return Err(Error::Precondition(format!(
            "name: node {} stays quarantined: {reason}",
            node.hostname
        )));
    }
    drivers::set_node_state(
        &state,
        node_id,
        NODE_BUSY,
        "returned by an operator; being reset",
    )
    .await?;
    // An operator's return admits a candidate: the approval step.
    let (id, now) = (node_id.to_string(), state.now());
    state
        .apply(move |conn| Ok::<_, Error>(store::nodes::put_in_service(conn, &id, now)?))
        .await?;
    tokio::spawn(crate::mig::reconcile_node(
        state,
        Fence::request(),
        node_id.to_string(),
    ));
    Ok(())
}

/// One round of periodic checks: quick checks on every ready node whose agent is live
/// and idle, all at once.
pub async fn periodic_round(state: &Arc<AppState>) -> Result<()> {
    let (nodes, changing) = state
        .read(|conn| -> Result<(Vec<NodeRow>, Vec<String>)> {
            let changing: Vec<String> =
                store::clusters::with_status(conn, &crate::cluster_status::CHANGING)?
                    .into_iter()
                    .map(|c| c.id)
                    .collect();
            Ok((store::nodes::list(conn, None, None)?, changing))
        })
        .await?;
    // Nodes of a cluster that a request is changing wait for the next round: that
    // request decides about them meanwhile.
    let nodes: Vec<NodeRow> = nodes
        .into_iter()
        .filter(|n| {
            n.state == NODE_READY
                && n.cluster_id.as_ref().is_none_or(|c| !changing.contains(c))
                && state.agents.is_live(&n.id)
                && !state.agents.has_pending(&n.id)
        })
        .collect();
    // A singleton's: every write of the checks and what follows a failure is fenced.
    let fence = Fence::singleton(state.lease().clone());
    let mut checks = tokio::task::JoinSet::new();
    for n in nodes {
        let (state, fence) = (state.clone(), fence.clone());
        checks
            .spawn(async move { check_one(&state, &fence, &n, "quick", Taking::Automatic).await });
    }
    while let Some(done) = checks.join_next().await {
        match done {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %e, "a periodic health check could not be recorded")
            }
            Err(e) => tracing::error!(error = %e, "a periodic health check stopped"),
        }
    }
    Ok(())
}

/// Periodic quick checks every `state.health.interval` until `stop` (never when zero).
pub async fn run_periodic(state: Arc<AppState>, mut stop: watch::Receiver<bool>) {
    let every = state.health.interval;
    if every.is_zero() {
        return;
    }
    loop {
        tokio::select! {
            _ = gpufleet_process::signals::stopped(&mut stop) => return,
            _ = tokio::time::sleep(every) => {
                if let Err(e) = periodic_round(&state).await {
                    tracing::error!(error = %e, "periodic health checks failed");
                }
            }
        }
    }
}

/// A cluster's acceptance settings and latest run (read off the async workers).
async fn acceptance_of(state: &AppState, cluster_id: &str) -> Result<store::health::Acceptance> {
    let id = cluster_id.to_string();
    state
        .read(move |conn| Ok::<_, Error>(store::health::acceptance(conn, &id)?))
        .await
}

/// A cluster's nodes now.
async fn nodes_of(state: &AppState, cluster_id: &str) -> Result<Vec<NodeRow>> {
    let id = cluster_id.to_string();
    state
        .read(move |conn| Ok::<_, Error>(store::nodes::list(conn, None, Some(&id))?))
        .await
}

/// The cluster `node` is in, if any.
async fn cluster_of(state: &AppState, node: &NodeRow) -> Result<Option<ClusterRow>> {
    let Some(id) = node.cluster_id.clone() else {
        return Ok(None);
    };
    state
        .read(move |conn| Ok::<_, Error>(store::clusters::get(conn, &id)?))
        .await
}

async fn node_row(state: &AppState, node_id: &str) -> Result<Option<NodeRow>> {
    let id = node_id.to_string();
    state
        .read(move |conn| Ok::<_, Error>(store::nodes::get(conn, &id)?))
        .await
}

async fn set_status(
    state: &AppState,
    fence: &Fence,
    cluster_id: &str,
    status: &'static str,
    why: &str,
) -> Result<()> {
    let (id, why, fence) = (cluster_id.to_string(), why.to_string(), fence.clone());
    state
        .apply(move |conn| {
            fence.check(conn)?;
            Ok::<_, Error>(store::clusters::set_status(conn, &id, status, &why)?)
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(name: &str, verdict: &str, value: &str, threshold: &str) -> Check {
        Check {
            name: name.into(),
            gpu_uuid: "GPU-1".into(),
            verdict: verdict.into(),
            value: value.into(),
            threshold: threshold.into(),
            ..Default::default()
        }
    }

    fn node() -> NodeRow {
        NodeRow {
            id: "n1".into(),
            hostname: "n1".into(),
            gpu_type: "H100-80GB".into(),
            capacity: "pool".into(),
            gpu_count: 1,
            driver_version: String::new(),
            cuda_version: String::new(),
            cluster_id: None,
            state: NODE_READY.into(),
            state_reason: String::new(),
            state_since: 0,
        }
    }

    #[test]
    fn a_former_leaders_quarantine_writes_nothing_and_the_leaders_and_a_requests_do() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = store::open(&dir.path().join("state.db")).unwrap();
        crate::lease::testing::seed(&conn);
        let (stale, current) = crate::lease::testing::stale_and_current(&mut conn);
        let settings = breaker::Settings::default();
        let n1 = store::nodes::get(&conn, "n1").unwrap().unwrap();
        let why = "failed health checks (quick): xid 79";
        // The periodic checks of a replica that lost the lease: refused, nothing written.
        let tx = conn.transaction().unwrap();
        let refused = quarantine_in(&tx, &stale, &settings, &n1, why, Taking::Automatic, 2000)
            .unwrap_err()
            .to_string();
        drop(tx);
        assert!(refused.contains("writes nothing"), "{refused}");
        let after = store::nodes::get(&conn, "n1").unwrap().unwrap();
        assert_eq!(
            (after.state.as_str(), after.cluster_id.as_deref()),
            (NODE_READY, Some("c1"))
        );
        // The leader's: quarantined and out of its cluster.
        quarantine_in(&conn, &current, &settings, &n1, why, Taking::Operator, 2000).unwrap();
        let after = store::nodes::get(&conn, "n1").unwrap().unwrap();
        assert_eq!(
            (after.state.as_str(), after.cluster_id),
            (NODE_QUARANTINED, None)
        );
        // A request's (a registration, a team's check on any replica): not fenced.
        let n2 = store::nodes::get(&conn, "n2").unwrap().unwrap();
        let request = Fence::request();
        quarantine_in(&conn, &request, &settings, &n2, why, Taking::Host, 2000).unwrap();
        let after = store::nodes::get(&conn, "n2").unwrap().unwrap();
        assert_eq!(after.state, NODE_QUARANTINED);
    }

    /// A node checked again after its checks ran out of time says so, whatever the
    /// second try found.
    #[test]
    fn a_check_tried_again_after_its_deadline_says_what_the_first_try_got() {
        let first = "node n1 gave no answer within 30s (the deadline of a check_quick order; serve --order-deadline)";
        let passed = Verdict::from_checks(node(), vec![check("xid", "pass", "0", "0")]);
        let v = retried_once(Ok(passed), first).unwrap();
        assert!(!v.failed);
        assert_eq!(
            v.summary,
            format!("all 1 checks passed (retried once; the first try: {first})")
        );
        let e = retried_once(Err("node n1 gave no answer within 30s".into()), first).unwrap_err();
        assert!(
            e.starts_with(
                "node n1 gave no answer within 30s (retried once; the first try: node n1"
            ),
            "{e}"
        );
    }

    #[test]
    fn bus_bandwidth_follows_the_all_reduce_convention() {
        assert_eq!(bus_bandwidth(10.0, 1), 0.0);
        assert_eq!(bus_bandwidth(10.0, 2), 10.0);
        assert_eq!(bus_bandwidth(10.0, 4), 15.0);
        // The pair threshold is the inverse: pairs at it give exactly the bus threshold.
        for n in 2..10 {
            let t = pair_threshold(30.0, n);
            assert!((bus_bandwidth(t, n) - 30.0).abs() < 1e-9);
        }
        assert_eq!(pair_threshold(0.0, 4), 0.0);
    }

    #[test]
    fn a_failed_check_names_its_value_and_threshold() {
        let v = Verdict::from_checks(
            node(),
            vec![
                check("temperature", "pass", "40 C", "85 C"),
                check("xid", "fail", "1 XID 79", "0"),
                check("dcgm_diag", "not_run", "", ""),
            ],
        );
        assert!(v.failed);
        assert_eq!(v.summary, "xid on GPU-1: 1 XID 79 (threshold 0)");
        assert_eq!(
            quarantine_reason("medium", &v),
            "failed health checks (medium): xid on GPU-1: 1 XID 79 (threshold 0)"
        );
        let ok = Verdict::from_checks(
            node(),
            vec![
                check("temperature", "pass", "40 C", "85 C"),
                check("power", "warn", "690 W", "700 W"),
                check("dcgm_diag", "not_run", "", ""),
            ],
        );
        assert!(!ok.failed);
        assert_eq!(ok.summary, "all 1 checks passed, 1 warning(s), 1 not run");
        // No report at all is a failure, never a pass.
        assert!(Verdict::no_answer(node(), "refused").failed);
    }

    fn named(host: &str) -> NodeRow {
        NodeRow {
            id: host.into(),
            hostname: host.into(),
            ..node()
        }
    }

    /// Node `from`'s answer: its one ring pair, to `to`.
    fn answered_pair(
        from: &str,
        to: &str,
        verdict: &str,
        gbps: f64,
    ) -> (NodeRow, std::result::Result<Verdict, String>) {
        (
            named(from),
            Ok(Verdict::from_checks(
                named(from),
                vec![pair(from, to, verdict, gbps)],
            )),
        )
    }

    fn pair(from: &str, to: &str, verdict: &str, gbps: f64) -> Check {
        Check {
            name: "bandwidth".into(),
            verdict: verdict.into(),
            value: format!("{gbps} Gbit/s"),
            threshold: "1 Gbit/s".into(),
            peer: to.into(),
            gbps,
            detail: format!("{from} to {to}"),
            ..Default::default()
        }
    }

    #[test]
    fn a_driver_or_layout_mismatch_alone_is_told_apart_from_other_failures() {
        let driver = check("driver", "fail", "570.133.20", "550.54.15");
        let layout = check("mig_layout", "fail", "whole GPU", "3g.40gb@0");
        let alone = Verdict::from_checks(named("a"), vec![driver.clone()]);
        assert!(only_changeable_failed(&alone));
        let both = Verdict::from_checks(named("a"), vec![driver.clone(), layout]);
        assert!(only_changeable_failed(&both));
        let with_xid = Verdict::from_checks(
            named("a"),
            vec![driver, check("xid", "fail", "1 XID 79", "0")],
        );
        assert!(!only_changeable_failed(&with_xid));
        let passed = Verdict::from_checks(named("a"), vec![check("driver", "pass", "1", "1")]);
        assert!(!only_changeable_failed(&passed));
    }

    #[test]
    fn every_pair_short_is_the_thresholds_result_and_not_a_nodes() {
        let ring = |verdicts: [&str; 2], extra: Option<Check>| {
            let mut a = vec![pair("a", "b", verdicts[0], 18.0)];
            a.extend(extra);
            attribute_bandwidth(vec![
                (named("a"), Ok(Verdict::from_checks(named("a"), a))),
                (
                    named("b"),
                    Ok(Verdict::from_checks(
                        named("b"),
                        vec![pair("b", "a", verdicts[1], 24.0)],
                    )),
                ),
            ])
        };
        // 100000 Gbit/s asked, loopback gives ~20: both pairs short, nothing else wrong.
        assert_eq!(short_everywhere(&ring(["fail", "fail"], None)), Some(24.0));
        // One pair reaches it: the other is a node's problem.
        assert_eq!(short_everywhere(&ring(["fail", "pass"], None)), None);
        // A node that also failed another check is still a node's problem.
        let xid = check("xid", "fail", "1 XID 79", "0");
        assert_eq!(short_everywhere(&ring(["fail", "fail"], Some(xid))), None);
        // No ring test at all.
        let alone = vec![Verdict::from_checks(named("a"), vec![])];
        assert_eq!(short_everywhere(&alone), None);
    }

    #[test]
    fn no_pair_connecting_is_named_unreachable_and_not_a_short_threshold() {
        let refused = |from: &str, to: &str| Check {
            value: NO_DATA.into(),
            detail: format!(
                "to {to} (127.0.0.1:7701): cannot connect to 127.0.0.1:7701: Connection refused"
            ),
            ..pair(from, to, "fail", 0.0)
        };
        let ring = |b_to_a: Check| {
            attribute_bandwidth(vec![
                (
                    named("a"),
                    Ok(Verdict::from_checks(named("a"), vec![refused("a", "b")])),
                ),
                (
                    named("b"),
                    Ok(Verdict::from_checks(named("b"), vec![b_to_a])),
                ),
            ])
        };
        let pairs = unreachable_everywhere(&ring(refused("b", "a"))).expect("unreachable");
        assert_eq!(pairs.len(), 2);
        assert!(
            pairs[0].starts_with("a to b (127.0.0.1:7701): cannot connect"),
            "{pairs:?}"
        );
        // One pair that connected (however slowly): the other is a node's problem.
        assert_eq!(
            unreachable_everywhere(&ring(pair("b", "a", "fail", 0.5))),
            None
        );
    }

    #[test]
    fn in_a_scale_up_a_slow_pair_with_a_joining_node_is_the_joining_nodes() {
        // A 2-node ring: both pairs slow, both ends blamed; the node in service (a) was
        // fine before, so only the joining node (b) fails.
        let answers = vec![
            answered_pair("a", "b", "fail", 0.05),
            answered_pair("b", "a", "fail", 0.05),
        ];
        let judged = blame_joining(attribute_bandwidth(answers.clone()), &[named("b")]);
        assert!(!judged[0].failed, "{:?}", judged[0].checks);
        assert!(judged[0].checks[0].detail.contains("attributed to b"));
        assert!(judged[1].failed);
        // Without joining nodes (a create, a check of the cluster), both stay failed.
        let all = blame_joining(attribute_bandwidth(answers), &[]);
        assert!(all.iter().all(|v| v.failed));
    }

    #[test]
    fn a_node_whose_agent_restarted_is_not_judged_nor_its_peers_pair_with_it() {
        let answers = vec![
            Verdict::from_checks(named("a"), vec![pair("a", "b", "fail", 0.0)]),
            Verdict::unjudged(named("b"), "its agent restarted or left during the checks"),
        ];
        let excused = excuse_unjudged(answers);
        assert!(!excused[0].failed && excused[0].judged);
        assert!(excused[0].checks[0].detail.contains("was not there"));
        assert!(!excused[1].failed && !excused[1].judged);
        assert!(excused[1].summary.starts_with("not judged"));
    }

    #[test]
    fn a_slow_node_is_blamed_for_both_of_its_pairs_and_its_neighbour_is_not() {
        // Ring a -> b -> c -> a; b is slow, so a->b and b->c fail.
        let answers = vec![
            answered_pair("a", "b", "fail", 0.05),
            answered_pair("b", "c", "fail", 0.05),
            answered_pair("c", "a", "pass", 9.0),
        ];
        let v = attribute_bandwidth(answers);
        let failed: Vec<&str> = v
            .iter()
            .filter(|v| v.failed)
            .map(|v| v.node.hostname.as_str())
            .collect();
        assert_eq!(failed, ["b"]);
        assert_eq!(v[0].checks[0].verdict, "warn");
        assert!(v[1]
            .summary
            .contains("bandwidth to c: 0.05 Gbit/s (threshold 1 Gbit/s)"));
        // One slow pair alone stays its sender's; no answer is a failure.
        let v = attribute_bandwidth(vec![
            answered_pair("a", "b", "fail", 0.05),
            (named("b"), Err("unreachable".into())),
        ]);
        assert!(v[0].failed && v[1].failed);
    }

    #[test]
    fn levels_and_settings_are_checked_naming_the_attribute() {
        assert_eq!(level("level", "quick").unwrap(), "quick");
        let e = level("acceptance.level", "deep").unwrap_err().to_string();
        assert!(
            e.starts_with("acceptance.level:") && e.contains("deep"),
            "{e}"
        );
        let base = Acceptance::default_for("c1");
        let none = crate::fleet::Delivers::default();
        let settings = |set, level, gbps, run| {
            acceptance_settings(base.clone(), set, level, gbps, run, "H100-80GB", &none)
        };
        assert_eq!(settings(false, "x", -1.0, false).unwrap(), base);
        let set = settings(true, "", 25.0, false).unwrap();
        assert_eq!(
            (
                set.level.as_str(),
                set.min_bus_bandwidth_gbps,
                set.run_on_create
            ),
            ("medium", 25.0, false)
        );
        let e = settings(true, "long", f64::NAN, true)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("acceptance.min_bus_bandwidth_gbps"), "{e}");
        // One upper bound: the API's.
        let e = settings(true, "long", MAX_BANDWIDTH_GBPS + 1.0, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("between 0 and 100000 Gbit/s"), "{e}");
    }

    #[test]
    fn a_threshold_above_what_the_fleet_declares_is_refused_naming_the_bound() {
        let base = Acceptance::default_for("c1");
        let delivers = crate::fleet::Delivers::new([("H100-80GB".to_string(), 400.0)].into());
        let ask = |gpu_type, gbps| {
            acceptance_settings(base.clone(), true, "quick", gbps, true, gpu_type, &delivers)
        };
        assert_eq!(
            ask("H100-80GB", 400.0).unwrap().min_bus_bandwidth_gbps,
            400.0
        );
        let e = ask("H100-80GB", 100_000.0).unwrap_err().to_string();
        assert!(
            e.starts_with("acceptance.min_bus_bandwidth_gbps: must be at most 400 Gbit/s")
                && e.contains("H100-80GB")
                && e.contains("(got 100000)"),
            "{e}"
        );
        // A model the fleet declares nothing for: the API's bound only.
        assert!(ask("A100-80GB", 100_000.0).is_ok());
        // Keeping the current settings checks nothing.
        assert!(
            acceptance_settings(base.clone(), false, "", 1e9, true, "H100-80GB", &delivers).is_ok()
        );
    }
}
