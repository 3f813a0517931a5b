//! Test doubles for the protocol layer's tests: a provider with one resource (`thing`,
//! identified by its name), one ephemeral resource (`ticket`), a list of things (five,
//! whatever the limit asks: the service must cut), an action (`ping`) and counters of what
//! the service asked of them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::framework::{
    ActionType, Attribute, DataSourceType, Diagnostics, EphemeralResourceType, IdentityAttribute,
    IdentitySchema, ListResourceType, Listed, Opened, PlannedChange, Progress, ProviderType,
    ResourceIdentity, ResourceType, Schema, Type, Value,
};

#[derive(Default)]
pub struct Calls {
    /// Identities made (`ResourceIdentity::of`).
    pub made: AtomicUsize,
    /// What close was given back.
    pub closed: Mutex<Vec<Option<Vec<u8>>>>,
}

impl Calls {
    pub fn made(&self) -> usize {
        self.made.load(Ordering::SeqCst)
    }
}

pub struct Thing;

#[async_trait]
impl ResourceType for Thing {
    fn name(&self) -> &'static str {
        "thing"
    }
    fn schema(&self) -> Schema {
        Schema::new(
            "t",
            vec![
                Attribute::required("name", Type::String, "n"),
                Attribute::optional("size", Type::Number, "s"),
            ],
        )
    }
    async fn read(&self, state: &Value) -> Result<Option<Value>, Diagnostics> {
        Ok(Some(state.clone()))
    }
    async fn plan(
        &self,
        _prior: Option<&Value>,
        proposed: Value,
        _config: &Value,
    ) -> Result<PlannedChange, Diagnostics> {
        Ok(PlannedChange {
            state: proposed,
            requires_replace: Vec::new(),
        })
    }
    async fn create(&self, planned: &Value, _config: &Value) -> Result<Value, Diagnostics> {
        Ok(planned.clone())
    }
    async fn update(&self, _p: &Value, planned: &Value, _c: &Value) -> Result<Value, Diagnostics> {
        Ok(planned.clone())
    }
    async fn delete(&self, _prior: &Value) -> Result<(), Diagnostics> {
        Ok(())
    }
    async fn import(&self, id: &str) -> Result<Value, Diagnostics> {
        Ok(Value::object([
            ("name", Value::string(id)),
            ("size", Value::Number(1)),
        ]))
    }
}

struct ThingIdentity(Arc<Calls>);

#[async_trait]
impl ResourceIdentity for ThingIdentity {
    fn resource(&self) -> &'static str {
        "thing"
    }
    fn schema(&self) -> IdentitySchema {
        IdentitySchema::new(vec![IdentityAttribute::required("name", "n")])
    }
    async fn of(&self, state: &Value) -> Result<Value, Diagnostics> {
        self.0.made.fetch_add(1, Ordering::SeqCst);
        Ok(Value::object([("name", state.get("name").clone())]))
    }
    fn import_id(&self, identity: &Value) -> Result<String, Diagnostics> {
        Ok(identity.str_attr("name")?.unwrap_or_default().to_string())
    }
}

struct Ticket(Arc<Calls>);

#[async_trait]
impl EphemeralResourceType for Ticket {
    fn name(&self) -> &'static str {
        "ticket"
    }
    fn schema(&self) -> Schema {
        Schema::new(
            "e",
            vec![
                Attribute::required("for", Type::String, "f"),
                Attribute::computed("secret", Type::String, "s").sensitive(),
            ],
        )
    }
    async fn open(&self, config: &Value) -> Result<Opened, Diagnostics> {
        let whom = config.str_attr("for")?.unwrap_or_default().to_string();
        Ok(Opened {
            result: Value::object([
                ("for", Value::string(&whom)),
                ("secret", Value::string("s3cret")),
            ]),
            private: Some(whom.into_bytes()),
            renew_at: Some(1_900_000_000),
        })
    }
    async fn close(&self, private: Option<&[u8]>) -> Result<(), Diagnostics> {
        self.0
            .closed
            .lock()
            .unwrap()
            .push(private.map(<[u8]>::to_vec));
        Ok(())
    }
}

struct Things;

#[async_trait]
impl ListResourceType for Things {
    fn name(&self) -> &'static str {
        "thing"
    }
    fn schema(&self) -> Schema {
        Schema::new("l", vec![Attribute::optional("prefix", Type::String, "p")])
    }
    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let mut d = Diagnostics::default();
        if config.str_attr("prefix")? == Some("") {
            d.attr_error("prefix", "must not be empty");
        }
        d.into_result()
    }
    async fn list(
        &self,
        config: &Value,
        include_state: bool,
        _limit: usize,
    ) -> Result<Vec<Listed>, Diagnostics> {
        let prefix = config.str_attr("prefix")?.unwrap_or("t").to_string();
        Ok((0..5)
            .map(|i| {
                let name = format!("{prefix}{i}");
                Listed {
                    identity: Value::object([("name", Value::string(&name))]),
                    display_name: format!("thing {name}"),
                    state: include_state.then(|| {
                        Value::object([("name", Value::string(&name)), ("size", Value::Number(i))])
                    }),
                }
            })
            .collect())
    }
}

/// Says two progress lines, then fails when `fail` is true.
struct Ping;

#[async_trait]
impl ActionType for Ping {
    fn name(&self) -> &'static str {
        "ping"
    }
    fn schema(&self) -> Schema {
        Schema::new(
            "a",
            vec![
                Attribute::required("target", Type::String, "t"),
                Attribute::optional("fail", Type::Bool, "f"),
            ],
        )
    }
    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let mut d = Diagnostics::default();
        if config.str_attr("target")? == Some("") {
            d.attr_error("target", "must not be empty");
        }
        d.into_result()
    }
    async fn invoke(&self, config: &Value, progress: &Progress) -> Result<(), Diagnostics> {
        let target = config.str_attr("target")?.unwrap_or_default().to_string();
        progress.say(format!("pinging {target}")).await;
        progress.say(format!("{target} answered")).await;
        if config.bool_attr("fail")? == Some(true) {
            let mut d = Diagnostics::default();
            d.attr_error("target", "answered too late");
            return Err(d);
        }
        Ok(())
    }
}

pub struct Fake(pub Arc<Calls>);

#[async_trait]
impl ProviderType for Fake {
    fn schema(&self) -> Schema {
        Schema::new("p", Vec::new())
    }
    async fn configure(&self, _config: &Value) -> Result<(), Diagnostics> {
        Ok(())
    }
    fn resources(&self) -> Vec<Arc<dyn ResourceType>> {
        vec![Arc::new(Thing)]
    }
    fn data_sources(&self) -> Vec<Arc<dyn DataSourceType>> {
        Vec::new()
    }
    fn ephemeral_resources(&self) -> Vec<Arc<dyn EphemeralResourceType>> {
        vec![Arc::new(Ticket(self.0.clone()))]
    }
    fn identities(&self) -> Vec<Arc<dyn ResourceIdentity>> {
        vec![Arc::new(ThingIdentity(self.0.clone()))]
    }
    fn list_resources(&self) -> Vec<Arc<dyn ListResourceType>> {
        vec![Arc::new(Things)]
    }
    fn actions(&self) -> Vec<Arc<dyn ActionType>> {
        vec![Arc::new(Ping)]
    }
}

/// The service over `Fake`, and its counters.
pub fn service() -> (super::service::ProviderService, Arc<Calls>) {
    let calls = Arc::new(Calls::default());
    let service = super::service::ProviderService::new("test", Arc::new(Fake(calls.clone())));
    (service, calls)
}
