//! Every acknowledged answer holds: the answers log (JSON lines, one acknowledged
//! create, resize or delete of a reservation or cluster each, in the order they were
//! given) against the store. An object's last answer decides: after a create or resize
//! it is there with the fields the answer gave; after a delete it is gone. While it is
//! there, its create's `request_id` (the request's own; resizes and deletes have none,
//! theirs only name the answer) still leads to it, so a retried create finds it instead
//! of making a second one. Answers about one object must come from one client, in its
//! order (a retried call logged once, when it is answered).
//!
//! ```json
//! {"request_id":"c3-17","op":"create","kind":"reservation","object":{"id":"9f0c...","tenant_id":"1b2e...","gpu_type":"H100-80GB","node_count":2,"start_time":1900000000,"end_time":1900003600}}
//! {"request_id":"c3-18","op":"resize","kind":"cluster","object":{"id":"77aa...","node_count":3}}
//! {"request_id":"c3-19","op":"delete","kind":"cluster","object":{"id":"77aa..."}}
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;

use super::snapshot::Snapshot;
use super::violation::{Concern, Violation};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Create,
    Resize,
    Delete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Reservation,
    Cluster,
}

/// The object an answer gave; fields left out are not compared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Answered {
    pub id: String,
    pub tenant_id: Option<String>,
    pub gpu_type: Option<String>,
    pub node_count: Option<i64>,
    /// Reservations: the window, Unix seconds.
    pub start_time: Option<i64>,
    pub end_time: Option<i64>,
    /// Clusters: their name and the reservation they draw from ("" none).
    pub name: Option<String>,
    pub reservation_id: Option<String>,
}

/// One acknowledged answer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    pub request_id: String,
    pub op: Op,
    pub kind: Kind,
    pub object: Answered,
}

/// Reads an answers log; a line that is not an answer is an error naming its line and
/// why (blank lines are skipped).
pub fn parse(text: &str) -> Result<Vec<Answer>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let answer: Answer =
            serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1))?;
        if answer.object.id.is_empty() {
            return Err(format!("line {}: object.id is empty", i + 1));
        }
        out.push(answer);
    }
    Ok(out)
}

pub fn check(s: &Snapshot, answers: &[Answer]) -> Vec<Violation> {
    let mut last: BTreeMap<(Kind, &str), &Answer> = BTreeMap::new();
    let mut created: BTreeMap<(Kind, &str), &Answer> = BTreeMap::new();
    for a in answers {
        last.insert((a.kind, a.object.id.as_str()), a);
        if a.op == Op::Create {
            created.insert((a.kind, a.object.id.as_str()), a);
        }
    }
    let mut out = Vec::new();
    for ((kind, id), a) in last {
        let stored = match kind {
            Kind::Reservation => s.reservation(id).map(|r| Answered {
                id: r.id.clone(),
                tenant_id: Some(r.tenant_id.clone()),
                gpu_type: Some(r.gpu_type.clone()),
                node_count: Some(r.node_count),
                start_time: Some(r.start_time),
                end_time: Some(r.end_time),
                name: None,
                reservation_id: None,
            }),
            Kind::Cluster => s.cluster(id).map(|c| Answered {
                id: c.id.clone(),
                tenant_id: Some(c.tenant_id.clone()),
                gpu_type: Some(c.gpu_type.clone()),
                node_count: Some(c.node_count),
                start_time: None,
                end_time: None,
                name: Some(c.name.clone()),
                reservation_id: Some(c.reservation_id.clone().unwrap_or_default()),
            }),
        };
        let what = format!("{} {id}", kind_name(kind));
        let said = format!("{} {}", op_name(a.op), a.request_id);
        match (a.op, stored) {
            (Op::Delete, Some(_)) => out.push(Violation::new(
                Concern::Answer,
                format!("{what} is still there, but {said} acknowledged its delete"),
            )),
            (Op::Delete, None) => {}
            (_, None) => out.push(Violation::new(
                Concern::Answer,
                format!("{what} is missing, but {said} acknowledged it"),
            )),
            (_, Some(stored)) => {
                for (field, answered, held) in differences(&a.object, &stored) {
                    out.push(Violation::new(
                        Concern::Answer,
                        format!("{what}: {field} is {held}, but {said} acknowledged {answered}"),
                    ));
                }
                if let Some(create) = created.get(&(kind, id)) {
                    let tenant = stored.tenant_id.clone().unwrap_or_default();
                    let key = (
                        kind_name(kind).to_string(),
                        tenant,
                        create.request_id.clone(),
                    );
                    let leads_to = s.request_ids.get(&key);
                    if leads_to.map(String::as_str) != Some(id) {
                        out.push(Violation::new(
                            Concern::Answer,
                            format!(
                                "{what}: the request_id {} of its create leads to {}, so a retry of that create would not find it",
                                create.request_id,
                                leads_to.map_or("nothing".to_string(), |o| format!("{} {o}", kind_name(kind)))
                            ),
                        ));
                    }
                }
            }
        }
    }
    out
}

/// (field, answered, stored) of each field the answer gave that the store differs in.
fn differences(answered: &Answered, stored: &Answered) -> Vec<(&'static str, String, String)> {
    fn differ<T: PartialEq + std::fmt::Debug>(
        out: &mut Vec<(&'static str, String, String)>,
        field: &'static str,
        answered: &Option<T>,
        stored: &Option<T>,
    ) {
        if let Some(a) = answered {
            if Some(a) != stored.as_ref() {
                let held = stored
                    .as_ref()
                    .map_or("absent".into(), |s| format!("{s:?}"));
                out.push((field, format!("{a:?}"), held));
            }
        }
    }
    let mut out = Vec::new();
    differ(
        &mut out,
        "tenant_id",
        &answered.tenant_id,
        &stored.tenant_id,
    );
    differ(&mut out, "gpu_type", &answered.gpu_type, &stored.gpu_type);
    differ(
        &mut out,
        "node_count",
        &answered.node_count,
        &stored.node_count,
    );
    differ(
        &mut out,
        "start_time",
        &answered.start_time,
        &stored.start_time,
    );
    differ(&mut out, "end_time", &answered.end_time, &stored.end_time);
    differ(&mut out, "name", &answered.name, &stored.name);
    differ(
        &mut out,
        "reservation_id",
        &answered.reservation_id,
        &stored.reservation_id,
    );
    out
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Reservation => "reservation",
        Kind::Cluster => "cluster",
    }
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Create => "create",
        Op::Resize => "resize",
        Op::Delete => "delete",
    }
}
