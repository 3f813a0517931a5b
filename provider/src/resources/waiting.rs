//! Waiting on long operations: the `timeouts` block (`create`, `update`, `delete`, each a
//! duration such as "45m"), the deadline a call and the polls after it run under, and the
//! error that says what the operation was still waiting on when time ran out.
//!
//! A call cut short by its deadline leaves the backend carrying on: the backend finishes
//! the change whether or not anyone still waits, and a repeated request picks it up.

use std::time::{Duration, Instant};

use gpufleet_proto::v1 as api;
use tonic::{Code, Status};

use crate::framework::{AttrPath, Attribute, Block, Diagnostic, Diagnostics, Type, Value};

/// How long an operation waits when its `timeouts` entry is unset.
pub const DEFAULT: Duration = Duration::from_secs(30 * 60);
/// The longest wait a `timeouts` entry may ask for.
const LONGEST: Duration = Duration::from_secs(7 * 24 * 3600);
/// The operations a `timeouts` block may set.
pub const OPERATIONS: [&str; 3] = ["create", "update", "delete"];
/// Statuses in which the backend is still changing an object.
pub const CHANGING: [&str; 3] = ["creating", "updating", "deleting"];
/// What a timed-out operation may still spend reading what it was waiting on.
const AFTERWORD: Duration = Duration::from_secs(10);

/// The `timeouts` block of a resource whose `operations` wait.
pub fn block(operations: &[&'static str]) -> Block {
    let attributes = operations
        .iter()
        .map(|op| {
            Attribute::optional(
                op,
                Type::String,
                match *op {
                    "create" => "How long a create waits for the backend, e.g. `\"45m\"` or `\"1h30m\"` (units `h`, `m`, `s`). Defaults to `30m`.",
                    "update" => "How long an update waits for the backend (e.g. a rolling driver change). Defaults to `30m`.",
                    _ => "How long a delete waits for the backend. Defaults to `30m`.",
                },
            )
        })
        .collect();
    Block {
        name: "timeouts",
        description: "How long an operation waits for the backend before the apply fails, saying what it was still waiting on. The backend carries on, and the next apply picks up where it is.",
        attributes,
    }
}

/// A duration as `timeouts` takes it: one or more `<whole number><unit>`, unit `h`, `m` or
/// `s` (e.g. "45m", "1h30m", "90s"), more than zero and at most a week.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration such as \"45m\", \"1h30m\" or \"90s\"");
    if text.is_empty() || text.len() > 32 {
        return Err(bad());
    }
    let mut total: u64 = 0;
    let mut digits = String::new();
    for ch in text.chars() {
        if ch.is_ascii_digit() {
            digits.push(ch);
            continue;
        }
        let unit: u64 = match ch {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return Err(bad()),
        };
        let n: u64 = digits.parse().map_err(|_| bad())?;
        digits.clear();
        total = n
            .checked_mul(unit)
            .and_then(|s| total.checked_add(s))
            .ok_or_else(bad)?;
    }
    if !digits.is_empty() {
        return Err(bad());
    }
    let d = Duration::from_secs(total);
    if d.is_zero() {
        return Err(format!("must be more than zero (got {text:?})"));
    }
    if d > LONGEST {
        return Err(format!("must be at most a week, 168h (got {text:?})"));
    }
    Ok(d)
}

/// Plan-time check of a configuration's `timeouts` block (values unknown until apply are
/// left alone).
pub fn check(config: &Value, diags: &mut Diagnostics) {
    let block = config.get("timeouts");
    for op in OPERATIONS {
        let path = AttrPath::attr("timeouts").child(op);
        match block.get(op).as_str(&path) {
            Ok(Some(text)) => {
                if let Err(reason) = parse_duration(text) {
                    diags.push(Diagnostic::error_at(
                        path.clone(),
                        format!("{path}: {reason}"),
                        "",
                    ));
                }
            }
            Ok(None) => {}
            Err(d) => diags.push(d),
        }
    }
}

/// How long `op` may take under the `timeouts` of a plan or state (the default when unset).
pub fn limit(state: &Value, op: &str) -> Result<Duration, Diagnostics> {
    let path = AttrPath::attr("timeouts").child(op);
    match state
        .get("timeouts")
        .get(op)
        .as_str(&path)
        .map_err(Diagnostics::from)?
    {
        Some(text) => parse_duration(text).map_err(|reason| {
            Diagnostic::error_at(path.clone(), format!("{path}: {reason}"), "").into()
        }),
        None => Ok(DEFAULT),
    }
}

/// The `timeouts` value to keep in state: the block's object, every operation present
/// (null where unset), whatever shape `v` had (absent in a state from before the block).
pub fn normalized(v: &Value) -> Value {
    Value::object(OPERATIONS.iter().map(|op| (*op, v.get(op).clone())))
}

/// A duration as a person writes it back ("2s", "45m", "1h30m").
pub fn render(d: Duration) -> String {
    let s = d.as_secs();
    let (h, m, sec) = (s / 3600, (s % 3600) / 60, s % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if sec > 0 || out.is_empty() {
        out.push_str(&format!("{sec}s"));
    }
    out
}

/// The time one operation has: `timeouts.<op>` from its start.
pub struct Deadline {
    pub op: &'static str,
    pub limit: Duration,
    until: Instant,
    pause: Duration,
}

/// The deadline passed before an answer came.
#[derive(Debug)]
pub struct Expired;

impl Deadline {
    pub fn new(op: &'static str, limit: Duration) -> Self {
        Self {
            op,
            limit,
            until: Instant::now() + limit,
            pause: Duration::from_millis(200),
        }
    }

    /// Time left, None once it has passed.
    pub fn remaining(&self) -> Option<Duration> {
        self.until
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
    }

    /// One call under the time left: `make` builds it with that time as its gRPC deadline
    /// (so the backend knows), and the call is abandoned when the time is up.
    pub async fn call<T, F, Fut>(&self, make: F) -> Result<Result<T, Status>, Expired>
    where
        F: FnOnce(Duration) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let left = self.remaining().ok_or(Expired)?;
        match tokio::time::timeout(left, make(left)).await {
            Ok(answer) => Ok(answer.map(tonic::Response::into_inner)),
            Err(_) => Err(Expired),
        }
    }

    /// Waits before the next look at an operation under way (a little longer each time),
    /// or says the time is up.
    pub async fn pause(&mut self) -> Result<(), Expired> {
        let left = self.remaining().ok_or(Expired)?;
        tokio::time::sleep(self.pause.min(left)).await;
        self.pause = (self.pause * 2).min(Duration::from_secs(2));
        self.remaining().map(|_| ()).ok_or(Expired)
    }
}

/// A request with `timeout` as its gRPC deadline.
pub fn with_deadline<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

/// A request with the short time a timed-out operation has left to read what it waited on.
pub fn afterword<T>(message: T) -> tonic::Request<T> {
    with_deadline(message, AFTERWORD)
}

/// Whether a call ended because a deadline (the call's, or the connection's own) cut it
/// short, while the backend carries on: the same request sent again picks it up.
pub fn cut_short(status: &Status) -> bool {
    matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled)
}

/// What an operation was waiting on when its time ran out, as said in its error.
pub struct Waiting<'a> {
    /// e.g. `tenant cluster "train"`.
    pub what: String,
    /// e.g. "created".
    pub done: &'a str,
    /// The object's status and status reason, when it could be read.
    pub status: Option<(String, String)>,
    /// Its latest events, oldest first.
    pub events: Vec<api::Event>,
}

/// Events said in a timeout's detail.
const EVENTS_SAID: usize = 5;

/// The error of an operation whose `timeouts` entry ran out.
pub fn timed_out(deadline: &Deadline, waiting: &Waiting) -> Diagnostic {
    let path = AttrPath::attr("timeouts").child(deadline.op);
    let on = match waiting.events.last() {
        Some(e) if !e.node.is_empty() => format!("; waiting for node {}: {}", e.node, e.message),
        Some(e) => format!("; waiting for: {}", e.message),
        None => match &waiting.status {
            Some((status, _)) => format!("; status {status}"),
            None => String::new(),
        },
    };
    let mut detail = Vec::new();
    if let Some((status, reason)) = &waiting.status {
        if reason.is_empty() {
            detail.push(format!("Status: {status}."));
        } else {
            detail.push(format!("Status: {status} ({reason})."));
        }
    }
    if !waiting.events.is_empty() {
        let skip = waiting.events.len().saturating_sub(EVENTS_SAID);
        detail.push("Latest events:".into());
        for e in &waiting.events[skip..] {
            let node = if e.node.is_empty() {
                String::new()
            } else {
                format!(" node {}:", e.node)
            };
            detail.push(format!("  - {}{node} {}", e.kind, e.message));
        }
    }
    detail.push(format!(
        "The backend carries on with it: the next apply picks it up where it is. To wait longer, raise timeouts.{} (now {}).",
        deadline.op,
        render(deadline.limit)
    ));
    Diagnostic::error_at(
        path,
        format!(
            "timeouts.{}: {} not {} within {}{on}",
            deadline.op,
            waiting.what,
            waiting.done,
            render(deadline.limit)
        ),
        detail.join("\n"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_read_like_other_providers_timeouts() {
        assert_eq!(parse_duration("45m").unwrap(), Duration::from_secs(2700));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        for bad in ["", "45", "m", "1.5h", "10 m", "5d", "-1s", "1h30"] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.contains("is not a duration"), "{bad}: {err}");
        }
        assert!(parse_duration("0s").unwrap_err().contains("more than zero"));
        assert!(parse_duration("169h")
            .unwrap_err()
            .contains("at most a week"));
        assert!(parse_duration("99999999999999999999h").is_err());
    }

    #[test]
    fn durations_render_back() {
        for text in ["2s", "45m", "1h30m", "30m", "1h0m5s"] {
            let d = parse_duration(text).unwrap();
            assert_eq!(parse_duration(&render(d)).unwrap(), d);
        }
        assert_eq!(render(DEFAULT), "30m");
        assert_eq!(render(Duration::from_secs(5400)), "1h30m");
    }

    #[test]
    fn a_bad_value_is_refused_naming_the_attribute() {
        let config = Value::object([(
            "timeouts",
            Value::object([("create", Value::string("soon")), ("update", Value::Null)]),
        )]);
        let mut diags = Diagnostics::default();
        check(&config, &mut diags);
        assert_eq!(diags.0.len(), 1);
        assert_eq!(
            diags.0[0].path,
            Some(AttrPath::attr("timeouts").child("create"))
        );
        assert!(diags.0[0].summary.starts_with("timeouts.create: \"soon\""));
        // Unset, null or unknown: nothing to say.
        let mut diags = Diagnostics::default();
        check(&Value::object([("timeouts", Value::Unknown)]), &mut diags);
        check(&Value::object([("timeouts", Value::Null)]), &mut diags);
        assert!(diags.0.is_empty());
    }

    #[test]
    fn unset_limits_are_the_default() {
        let state = Value::object([("timeouts", Value::object([("update", Value::string("2s"))]))]);
        assert_eq!(limit(&state, "update").unwrap(), Duration::from_secs(2));
        assert_eq!(limit(&state, "create").unwrap(), DEFAULT);
        assert_eq!(limit(&Value::Null, "delete").unwrap(), DEFAULT);
        let n = normalized(&Value::Null);
        for op in OPERATIONS {
            assert_eq!(n.get(op), &Value::Null);
        }
    }

    #[test]
    fn the_error_says_what_it_waited_on() {
        let deadline = Deadline::new("create", Duration::from_secs(2));
        let event = |kind: &str, node: &str, message: &str| api::Event {
            kind: kind.into(),
            node: node.into(),
            message: message.into(),
            ..Default::default()
        };
        let d = timed_out(
            &deadline,
            &Waiting {
                what: "tenant cluster \"train\"".into(),
                done: "created",
                status: Some(("creating".into(), String::new())),
                events: vec![event(
                    "driver_install_started",
                    "n1",
                    "driver install: installing 580.65.06",
                )],
            },
        );
        assert_eq!(d.path, Some(AttrPath::attr("timeouts").child("create")));
        assert_eq!(
            d.summary,
            "timeouts.create: tenant cluster \"train\" not created within 2s; waiting for node n1: driver install: installing 580.65.06"
        );
        assert!(d.detail.contains("Status: creating."), "{}", d.detail);
        assert!(d.detail.contains("next apply picks it up"), "{}", d.detail);
    }

    #[tokio::test]
    async fn a_call_past_its_deadline_is_abandoned() {
        let deadline = Deadline::new("update", Duration::from_millis(50));
        let answer = deadline
            .call(|_| async { std::future::pending::<Result<tonic::Response<()>, Status>>().await })
            .await;
        assert!(answer.is_err());
        assert!(deadline.remaining().is_none());
    }
}
