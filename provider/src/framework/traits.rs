//! The contracts a resource and a data source implement, free of any protocol library.

use async_trait::async_trait;

use super::diagnostics::Diagnostics;
use super::path::AttrPath;
use super::schema::Schema;
use super::value::Value;

/// What a plan for one resource instance says.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedChange {
    /// The planned state: known values must equal the state after apply.
    pub state: Value,
    /// Attributes whose change forces the resource to be replaced.
    pub requires_replace: Vec<AttrPath>,
}

/// A managed resource. A wrapper implements it too (`resources::credentials::Withheld`):
/// a method added here with a default body must be forwarded there, or the wrapped
/// resources silently get the default.
#[async_trait]
pub trait ResourceType: Send + Sync {
    /// The type name without the provider prefix, e.g. `tenant`.
    fn name(&self) -> &'static str;

    fn schema(&self) -> Schema;

    /// Checks the configuration alone (no backend): values may be unknown.
    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let _ = config;
        Ok(())
    }

    /// The object as the backend has it now; `None` when it no longer exists.
    async fn read(&self, state: &Value) -> Result<Option<Value>, Diagnostics>;

    /// Plans a create (`prior` is `None`) or an update.
    async fn plan(
        &self,
        prior: Option<&Value>,
        proposed: Value,
        config: &Value,
    ) -> Result<PlannedChange, Diagnostics>;

    async fn create(&self, planned: &Value, config: &Value) -> Result<Value, Diagnostics>;

    async fn update(
        &self,
        prior: &Value,
        planned: &Value,
        config: &Value,
    ) -> Result<Value, Diagnostics>;

    async fn delete(&self, prior: &Value) -> Result<(), Diagnostics>;

    /// Plans a delete: a refusal stops the plan (nothing is deleted at all). By default
    /// every delete may happen.
    async fn plan_delete(&self, prior: &Value) -> Result<(), Diagnostics> {
        let _ = prior;
        Ok(())
    }

    /// The full state of the object with this id.
    async fn import(&self, id: &str) -> Result<Value, Diagnostics>;

    /// Warnings on an update planned in place from `prior` to `planned`, or on a create
    /// (`prior` null), shown; the plan goes on. By default none.
    fn plan_warnings(&self, prior: &Value, planned: &Value) -> Diagnostics {
        let _ = (prior, planned);
        Diagnostics::default()
    }
}

#[async_trait]
pub trait DataSourceType: Send + Sync {
    /// The type name without the provider prefix, e.g. `gpu_types`.
    fn name(&self) -> &'static str;

    fn schema(&self) -> Schema;

    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let _ = config;
        Ok(())
    }

    async fn read(&self, config: &Value) -> Result<Value, Diagnostics>;
}

/// The provider itself: its configuration and what it offers.
#[async_trait]
pub trait ProviderType: Send + Sync + 'static {
    fn schema(&self) -> Schema;

    /// Receives the provider block's values (some may be unknown during plan).
    async fn configure(&self, config: &Value) -> Result<(), Diagnostics>;

    fn resources(&self) -> Vec<std::sync::Arc<dyn ResourceType>>;

    fn data_sources(&self) -> Vec<std::sync::Arc<dyn DataSourceType>>;

    /// Ephemeral resources (Terraform 1.10+; older clients never see them).
    fn ephemeral_resources(&self) -> Vec<std::sync::Arc<dyn super::EphemeralResourceType>> {
        Vec::new()
    }

    /// The identities of the managed resources (Terraform 1.12+), by resource name.
    fn identities(&self) -> Vec<std::sync::Arc<dyn super::ResourceIdentity>> {
        Vec::new()
    }

    /// List resources for `terraform query` (Terraform 1.14+), each of a managed resource
    /// type that has an identity.
    fn list_resources(&self) -> Vec<std::sync::Arc<dyn super::ListResourceType>> {
        Vec::new()
    }

    /// Actions (Terraform 1.14+).
    fn actions(&self) -> Vec<std::sync::Arc<dyn super::ActionType>> {
        Vec::new()
    }
}
