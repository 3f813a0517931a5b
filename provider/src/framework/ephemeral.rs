//! The contract of an ephemeral resource (Terraform 1.10+): a value opened for one plan or
//! apply, used by the configuration (a provider block, a provisioner) and never written to
//! state or plan. Free of any protocol library.

use async_trait::async_trait;

use super::diagnostics::Diagnostics;
use super::schema::Schema;
use super::value::Value;

/// What an open gives: the result Terraform uses, what renew and close need to find the
/// same object again (Terraform keeps it in memory only), and when to renew.
#[derive(Clone, Debug, PartialEq)]
pub struct Opened {
    pub result: Value,
    pub private: Option<Vec<u8>>,
    /// Unix seconds: Terraform calls renew then, if the run still uses the value.
    pub renew_at: Option<i64>,
}

#[async_trait]
pub trait EphemeralResourceType: Send + Sync {
    /// The type name without the provider prefix, e.g. `cluster_credentials`.
    fn name(&self) -> &'static str;

    fn schema(&self) -> Schema;

    /// Checks the configuration alone (no backend): values may be unknown.
    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let _ = config;
        Ok(())
    }

    /// Opens the value; `config` is wholly known (Terraform does not open otherwise).
    async fn open(&self, config: &Value) -> Result<Opened, Diagnostics>;

    /// Keeps an opened value alive; answers the next renewal time, if any.
    async fn renew(&self, private: Option<&[u8]>) -> Result<Option<i64>, Diagnostics> {
        let _ = private;
        Ok(None)
    }

    /// Ends what open started (e.g. revokes a minted token).
    async fn close(&self, private: Option<&[u8]>) -> Result<(), Diagnostics> {
        let _ = private;
        Ok(())
    }
}
