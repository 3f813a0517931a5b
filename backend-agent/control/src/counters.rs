//! The control plane's counters, counted as things happen (process-wide, whether or not
//! `--metrics-listen` is given): `gpufleet_api_requests_total{method,code}`,
//! `gpufleet_api_request_seconds{method}`, `gpufleet_work_orders_total{kind,outcome}`,
//! `gpufleet_health_checks_total{check,result}`, `gpufleet_agent_answers_refused_total{reason}`,
//! `gpufleet_quarantines_total{gpu_type,cause}`, `gpufleet_check_failures_total{gpu_type,level,check}`,
//! the API's connections (`gpufleet_api_connections_open`,
//! `gpufleet_api_connections_refused_total{reason}`, `gpufleet_api_connections_closed_total{reason}`,
//! `gpufleet_api_accept_errors_total{kind}`) and what agents sent that was not taken
//! (`gpufleet_agent_messages_dropped_total{reason}`, `gpufleet_agent_sessions_cut_total{reason}`),
//! and audit entries lost to a full queue (`gpufleet_audit_dropped_total`).
//! `crate::metrics` serves them.

use std::sync::LazyLock;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry};

use crate::registry::Outcome;

pub use gpufleet_wire::order_kind::{DRIVER as ORDER_DRIVER, MIG_LAYOUT as ORDER_MIG_LAYOUT};
/// `check` of the quick health check an agent runs after a driver install.
pub const CHECK_DRIVER_INSTALL: &str = "driver_install";

/// The counters and the histogram, in one registry.
pub struct Counters {
    pub(crate) registry: Registry,
    pub api_requests: IntCounterVec,
    pub api_seconds: HistogramVec,
    pub work_orders: IntCounterVec,
    pub health_checks: IntCounterVec,
    pub refused_answers: IntCounterVec,
    pub quarantines: IntCounterVec,
    pub check_failures: IntCounterVec,
    pub api_connections_open: IntGauge,
    pub api_connections_refused: IntCounterVec,
    pub api_connections_closed: IntCounterVec,
    pub api_accept_errors: IntCounterVec,
    pub agent_messages_dropped: IntCounterVec,
    pub agent_sessions_cut: IntCounterVec,
    pub audit_dropped: prometheus::IntCounter,
}

pub static COUNTERS: LazyLock<Counters> = LazyLock::new(|| {
    let registry = Registry::new();
    let api_requests = IntCounterVec::new(
        Opts::new(
            "gpufleet_api_requests_total",
            "gRPC requests to the control plane's API by method and gRPC status code.",
        ),
        &["method", "code"],
    )
    .expect("a valid counter");
    let api_seconds = HistogramVec::new(
        HistogramOpts::new(
            "gpufleet_api_request_seconds",
            "Time from a gRPC request to its response headers, by method.",
        )
        .buckets(vec![
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            60.0,
        ]),
        &["method"],
    )
    .expect("a valid histogram");
    let work_orders = IntCounterVec::new(
        Opts::new(
            "gpufleet_work_orders_total",
            "Work orders the control plane sent to node agents, by kind and outcome (ok, failed, unreachable).",
        ),
        &["kind", "outcome"],
    )
    .expect("a valid counter");
    let health_checks = IntCounterVec::new(
        Opts::new(
            "gpufleet_health_checks_total",
            "GPU health checks by check and result (pass, fail).",
        ),
        &["check", "result"],
    )
    .expect("a valid counter");
    let refused_answers = IntCounterVec::new(
        Opts::new(
            "gpufleet_agent_answers_refused_total",
            "Answers of node agents the control plane did not believe, by reason (unsolicited: for no order it waits for; out_of_bounds: a report that is not the node's).",
        ),
        &["reason"],
    )
    .expect("a valid counter");
    let quarantines = IntCounterVec::new(
        Opts::new(
            "gpufleet_quarantines_total",
            "Nodes taken out of service, by GPU model and cause: the first failed check (xid, ecc_uncorrected_volatile, bandwidth, driver, agent...), driver_install, or deadline (an order left unanswered).",
        ),
        &["gpu_type", "cause"],
    )
    .expect("a valid counter");
    let check_failures = IntCounterVec::new(
        Opts::new(
            "gpufleet_check_failures_total",
            "Failed checks of acceptance, periodic, registration and on-demand health runs, by GPU model, level and check.",
        ),
        &["gpu_type", "level", "check"],
    )
    .expect("a valid counter");
    let api_connections_open = IntGauge::new(
        "gpufleet_api_connections_open",
        "Connections to the API open now.",
    )
    .expect("a valid gauge");
    let api_connections_refused = IntCounterVec::new(
        Opts::new(
            "gpufleet_api_connections_refused_total",
            "Connections to the API closed at accept, by the cap they were over (max_connections, max_connections_per_peer).",
        ),
        &["reason"],
    )
    .expect("a valid counter");
    let api_connections_closed = IntCounterVec::new(
        Opts::new(
            "gpufleet_api_connections_closed_total",
            "Connections to the API the control plane closed, by reason (no_request: none within the first-request deadline; idle: none in flight for the idle timeout).",
        ),
        &["reason"],
    )
    .expect("a valid counter");
    let api_accept_errors = IntCounterVec::new(
        Opts::new(
            "gpufleet_api_accept_errors_total",
            "Failed accepts on the API's listener, by kind (exhausted: out of file descriptors or memory, backed off; other: skipped).",
        ),
        &["kind"],
    )
    .expect("a valid counter");
    let agent_messages_dropped = IntCounterVec::new(
        Opts::new(
            "gpufleet_agent_messages_dropped_total",
            "Messages of node agents' sessions dropped unread, by reason (rate: over the session's message rate).",
        ),
        &["reason"],
    )
    .expect("a valid counter");
    let agent_sessions_cut = IntCounterVec::new(
        Opts::new(
            "gpufleet_agent_sessions_cut_total",
            "Node agents' sessions the control plane ended, by reason (rate: over the message rate for too long; protocol: a heartbeat out of bounds or out of sequence).",
        ),
        &["reason"],
    )
    .expect("a valid counter");
    let audit_dropped = prometheus::IntCounter::new(
        "gpufleet_audit_dropped_total",
        "Audit entries dropped because the audit log's queue was full (a flood of refused calls).",
    )
    .expect("a valid counter");
    for c in [
        Box::new(api_requests.clone()) as Box<dyn prometheus::core::Collector>,
        Box::new(audit_dropped.clone()),
        Box::new(api_connections_open.clone()),
        Box::new(api_connections_refused.clone()),
        Box::new(api_connections_closed.clone()),
        Box::new(api_accept_errors.clone()),
        Box::new(agent_messages_dropped.clone()),
        Box::new(agent_sessions_cut.clone()),
        Box::new(api_seconds.clone()),
        Box::new(work_orders.clone()),
        Box::new(health_checks.clone()),
        Box::new(refused_answers.clone()),
        Box::new(quarantines.clone()),
        Box::new(check_failures.clone()),
    ] {
        registry.register(c).expect("a counter registered once");
    }
    // Every known series from the start, so that dashboards and rate() see a 0 first.
    for kind in [ORDER_MIG_LAYOUT, ORDER_DRIVER] {
        for outcome in ["ok", "failed", "unreachable", "timed_out"] {
            work_orders.with_label_values(&[kind, outcome]);
        }
    }
    for result in ["pass", "fail"] {
        health_checks.with_label_values(&[CHECK_DRIVER_INSTALL, result]);
    }
    for reason in [UNSOLICITED, OUT_OF_BOUNDS] {
        refused_answers.with_label_values(&[reason]);
    }
    for reason in ["max_connections", "max_connections_per_peer"] {
        api_connections_refused.with_label_values(&[reason]);
    }
    for reason in ["no_request", "idle"] {
        api_connections_closed.with_label_values(&[reason]);
    }
    for kind in ["exhausted", "other"] {
        api_accept_errors.with_label_values(&[kind]);
    }
    agent_messages_dropped.with_label_values(&[AGENT_RATE]);
    for reason in [AGENT_RATE, AGENT_PROTOCOL] {
        agent_sessions_cut.with_label_values(&[reason]);
    }
    Counters {
        audit_dropped,
        api_connections_open,
        api_connections_refused,
        api_connections_closed,
        api_accept_errors,
        agent_messages_dropped,
        agent_sessions_cut,
        registry,
        api_requests,
        api_seconds,
        work_orders,
        health_checks,
        refused_answers,
        quarantines,
        check_failures,
    }
});

/// `cause` of a quarantine for an order left unanswered past its deadline.
pub const CAUSE_DEADLINE: &str = "deadline";
/// `cause` of a quarantine for a failed driver install.
pub const CAUSE_DRIVER_INSTALL: &str = "driver_install";

/// Counts a node of `gpu_type` taken out of service for `cause`.
pub fn quarantine(gpu_type: &str, cause: &str) {
    COUNTERS
        .quarantines
        .with_label_values(&[gpu_type, cause])
        .inc();
}

/// Counts a failed check of a health run.
pub fn check_failed(gpu_type: &str, level: &str, check: &str) {
    COUNTERS
        .check_failures
        .with_label_values(&[gpu_type, level, check])
        .inc();
}

/// `reason` of an answer to no order the control plane waits for.
pub const UNSOLICITED: &str = "unsolicited";
/// `reason` of an answer whose report is not the node's.
pub const OUT_OF_BOUNDS: &str = "out_of_bounds";

/// Counts an agent's answer that was not believed.
pub fn refused_result(reason: &str) {
    COUNTERS.refused_answers.with_label_values(&[reason]).inc();
}

/// Counts a work order of `kind` that has come to its `outcome`.
pub fn work_order(kind: &str, outcome: &Outcome) {
    let label = match outcome {
        Outcome::Answered(r) if r.ok => "ok",
        Outcome::Answered(r) if r.error_kind == crate::registry::DEADLINE => "timed_out",
        Outcome::Answered(_) => "failed",
        Outcome::Unreachable(_) => "unreachable",
    };
    COUNTERS.work_orders.with_label_values(&[kind, label]).inc();
}

/// Counts the quick health check that follows a driver install, from the agent's answer:
/// an install answered ok passed it; one that failed on it says so in its error. Other
/// failures (the install itself) ran no check and count nothing.
pub fn driver_install_check(outcome: &Outcome) {
    let result = match outcome {
        Outcome::Answered(r) if r.ok => "pass",
        Outcome::Answered(r) if r.error.contains("quick health check failed") => "fail",
        _ => return,
    };
    COUNTERS
        .health_checks
        .with_label_values(&[CHECK_DRIVER_INSTALL, result])
        .inc();
}

/// Counts a connection refused at accept for being over the cap `reason`.
pub fn connection_refused(reason: &str) {
    COUNTERS
        .api_connections_refused
        .with_label_values(&[reason])
        .inc();
}

/// Counts a connection closed for overstaying (`reason`: no_request, idle).
pub fn connection_closed(reason: &str) {
    COUNTERS
        .api_connections_closed
        .with_label_values(&[reason])
        .inc();
}

/// Counts a failed accept.
pub fn accept_error(exhausted: bool) {
    let kind = if exhausted { "exhausted" } else { "other" };
    COUNTERS.api_accept_errors.with_label_values(&[kind]).inc();
}

/// `reason` of agents' messages dropped, or sessions cut, for their rate.
pub const AGENT_RATE: &str = "rate";
/// `reason` of agents' sessions cut for a heartbeat out of bounds or out of sequence.
pub const AGENT_PROTOCOL: &str = "protocol";
/// `reason` of a heartbeat's GPU readings dropped (not the node's GPUs, or out of range);
/// the heartbeat itself counts.
pub const AGENT_TELEMETRY: &str = "telemetry";

/// Counts an agent's message dropped unread.
pub fn agent_message_dropped(reason: &str) {
    COUNTERS
        .agent_messages_dropped
        .with_label_values(&[reason])
        .inc();
}

/// Counts an agent's session the control plane ended.
pub fn agent_session_cut(reason: &str) {
    COUNTERS
        .agent_sessions_cut
        .with_label_values(&[reason])
        .inc();
}
