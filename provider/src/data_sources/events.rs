//! `gpufleet_events`: what happened to one object (a cluster, a node), oldest first:
//! allocations, partitions, driver changes, failed checks, replacements.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;

use super::required_arg;
use crate::framework::{Attribute, DataSourceType, Diagnostics, Schema, Type, Value};
use crate::state::ProviderState;
use crate::times;

pub struct Events {
    provider: Arc<ProviderState>,
}

impl Events {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

fn event_type() -> Type {
    Type::object([
        ("seq", Type::Number),
        ("time", Type::String),
        ("kind", Type::String),
        ("node", Type::String),
        ("message", Type::String),
    ])
}

fn event_value(e: &api::Event) -> Value {
    let time = e
        .time
        .as_ref()
        .map_or(Value::Null, |t| Value::String(times::canonical(t.seconds)));
    Value::object([
        ("seq", Value::Number(e.seq)),
        ("time", time),
        ("kind", Value::string(&e.kind)),
        ("node", Value::string(&e.node)),
        ("message", Value::string(&e.message)),
    ])
}

fn answer_state(config: &Value, object_id: &str, events: &[api::Event]) -> Value {
    let mut state = config.clone();
    state.set("id", Value::String(format!("events/{object_id}")));
    state.set(
        "events",
        Value::List(events.iter().map(event_value).collect()),
    );
    state
}

#[async_trait]
impl DataSourceType for Events {
    fn name(&self) -> &'static str {
        "events"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "What happened to one object (a tenant cluster), oldest first.",
            vec![
                Attribute::computed("id", Type::String, "`events/<object_id>`."),
                Attribute::required(
                    "object_id",
                    Type::String,
                    "The object's id, e.g. a `gpufleet_tenant_cluster`'s `id`; the token must see it.",
                ),
                Attribute::computed(
                    "events",
                    Type::list(event_type()),
                    "Its events, oldest first: `seq`, `time` (RFC 3339), `kind` (`allocated`, `released`, `partitioned`, `partitioning`, `driver_install_started`, `acceptance_checking`, `node_draining`, `node_drained`, `node_returned`, `node_quarantined`, `quarantine_held`, `check_failed`, `node_unreachable`, `node_reachable`, `node_replaced`, `deleted`; a breaker's: `breaker_opened`, `breaker_reset`), `node` (the node it concerns, or empty) and `message`.",
                ),
            ],
        )
    }

    async fn read(&self, config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let object_id = required_arg(config, "object_id")?;
        let mut events = Vec::new();
        let mut page_token = String::new();
        loop {
            let page = client
                .fleet()
                .list_events(api::ListEventsRequest {
                    object_id: object_id.clone(),
                    page_token,
                    ..Default::default()
                })
                .await
                .map_err(|s| client.diagnostic(&s))?
                .into_inner();
            events.extend(page.events);
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
        Ok(answer_state(config, &object_id, &events))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_keep_their_order_with_rfc3339_times() {
        let config = Value::object([
            ("id", Value::Null),
            ("object_id", Value::string("c-1")),
            ("events", Value::Null),
        ]);
        let events = [
            api::Event {
                seq: 7,
                time: Some(times::to_proto(1_800_000_000)),
                object_id: "c-1".into(),
                kind: "node_draining".into(),
                node: "h100-01".into(),
                message: "draining for driver 570.211.01".into(),
                ..Default::default()
            },
            api::Event {
                seq: 8,
                time: None,
                object_id: "c-1".into(),
                kind: "driver_changed".into(),
                node: String::new(),
                message: "done".into(),
                ..Default::default()
            },
        ];
        let state = answer_state(&config, "c-1", &events);
        assert_eq!(state.get("id"), &Value::string("events/c-1"));
        let Value::List(listed) = state.get("events") else {
            panic!("events is not a list");
        };
        assert_eq!(
            listed[0],
            Value::object([
                ("seq", Value::Number(7)),
                ("time", Value::string("2027-01-15T08:00:00Z")),
                ("kind", Value::string("node_draining")),
                ("node", Value::string("h100-01")),
                ("message", Value::string("draining for driver 570.211.01")),
            ])
        );
        assert_eq!(listed[1].get("time"), &Value::Null);
        assert_eq!(listed[1].get("seq"), &Value::Number(8));
    }
}
