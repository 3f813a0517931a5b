//! `gpufleet_audit_log`: who changed what, and every refused call, oldest first. The
//! admin token reads every tenant's (or one's); a tenant token only its own, numbered in
//! its own sequence.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;

use crate::framework::{Attribute, DataSourceType, Diagnostics, Schema, Type, Value};
use crate::resources::common::answered;
use crate::state::ProviderState;
use crate::times;

pub struct AuditLog {
    provider: Arc<ProviderState>,
}

impl AuditLog {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

fn entry_type() -> Type {
    Type::object([
        ("seq", Type::Number),
        ("time", Type::String),
        ("tenant_id", Type::String),
        ("token_name", Type::String),
        ("token_scope", Type::String),
        ("method", Type::String),
        ("object", Type::String),
        ("outcome", Type::String),
        ("message", Type::String),
    ])
}

fn entry_value(e: &api::AuditEntry) -> Value {
    Value::object([
        ("seq", Value::Number(e.seq)),
        (
            "time",
            e.time
                .as_ref()
                .map_or(Value::Null, |t| Value::String(times::canonical(t.seconds))),
        ),
        ("tenant_id", Value::string(&e.tenant_id)),
        ("token_name", Value::string(&e.token_name)),
        ("token_scope", Value::string(&e.token_scope)),
        ("method", Value::string(&e.method)),
        ("object", Value::string(&e.object)),
        ("outcome", Value::string(&e.outcome)),
        ("message", Value::string(&e.message)),
    ])
}

#[async_trait]
impl DataSourceType for AuditLog {
    fn name(&self) -> &'static str {
        "audit_log"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "The audit log: every change and every refused call, oldest first (the admin: all or one tenant's; a tenant token: its own).",
            vec![
                Attribute::computed("id", Type::String, "`audit/<tenant>`."),
                Attribute::optional(
                    "tenant",
                    Type::String,
                    "Only this tenant's entries, by id or name (the admin token). A tenant token reads its own whatever this says of another tenant (which is refused).",
                ),
                Attribute::computed(
                    "entries",
                    Type::list(entry_type()),
                    "The entries, oldest first: `seq` (the reader's own sequence), `time` (RFC 3339), `tenant_id`, `token_name` and `token_scope` (empty for no valid token; never the secret), `method` (`gpufleet.v1.Service/Method`), `object`, `outcome` (`OK` or the gRPC code's name) and `message` (a refusal's).",
                ),
            ],
        )
    }

    async fn read(&self, config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let tenant = config
            .str_attr("tenant")
            .map_err(Diagnostics::from)?
            .unwrap_or_default()
            .to_string();
        let mut entries = Vec::new();
        let mut page_token = String::new();
        loop {
            let request = api::ListAuditEntriesRequest {
                tenant_id: tenant.clone(),
                page_size: 0,
                page_token,
            };
            let page = answered(&client, client.access().list_audit_entries(request).await)?;
            entries.extend(page.entries.iter().map(entry_value));
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
        let mut state = config.clone();
        state.set("id", Value::String(format!("audit/{tenant}")));
        state.set("entries", Value::List(entries));
        Ok(state)
    }
}
