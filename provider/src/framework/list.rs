//! The contract of a list resource (`terraform query`, Terraform 1.14+): the objects of one
//! managed resource type that the caller may see, each named by its identity. Free of any
//! protocol library.

use async_trait::async_trait;

use super::diagnostics::Diagnostics;
use super::schema::Schema;
use super::value::Value;

/// One object found: its identity (of the managed resource's identity schema), a name for
/// people, and when asked its state (of the managed resource's schema).
#[derive(Clone, Debug, PartialEq)]
pub struct Listed {
    pub identity: Value,
    pub display_name: String,
    pub state: Option<Value>,
}

#[async_trait]
pub trait ListResourceType: Send + Sync {
    /// The managed resource type it lists, without the provider prefix (Terraform names a
    /// list by the resource type whose objects it finds).
    fn name(&self) -> &'static str;

    /// The schema of the list block's `config`.
    fn schema(&self) -> Schema;

    /// Checks the configuration alone (no backend): values may be unknown.
    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let _ = config;
        Ok(())
    }

    /// At most `limit` objects, with their states when `include_state`.
    async fn list(
        &self,
        config: &Value,
        include_state: bool,
        limit: usize,
    ) -> Result<Vec<Listed>, Diagnostics>;
}
