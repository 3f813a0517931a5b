//! The contract of an action (Terraform 1.14+): a day-2 operation an `action` block names
//! and `terraform apply -invoke=action.TYPE.NAME` (or a lifecycle trigger) runs, with
//! progress lines while it works. Free of any protocol library.

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::diagnostics::Diagnostics;
use super::schema::Schema;
use super::value::Value;

/// Where an action says how far it got; each line is shown in Terraform's UI as it comes.
#[derive(Clone)]
pub struct Progress(mpsc::Sender<String>);

impl Progress {
    pub fn new(lines: mpsc::Sender<String>) -> Self {
        Self(lines)
    }

    /// Waits while the channel is full (it is bounded); a line for a Terraform that went
    /// away is dropped.
    pub async fn say(&self, line: impl Into<String>) {
        let _ = self.0.send(line.into()).await;
    }
}

#[async_trait]
pub trait ActionType: Send + Sync {
    /// The type name without the provider prefix, e.g. `run_health_check`.
    fn name(&self) -> &'static str;

    /// The schema of the action block's `config`.
    fn schema(&self) -> Schema;

    /// Checks the configuration alone (no backend): values may be unknown.
    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let _ = config;
        Ok(())
    }

    /// Checks at plan (may ask the backend); values may still be unknown. By default the
    /// configuration checks again.
    async fn plan(&self, config: &Value) -> Result<(), Diagnostics> {
        self.validate(config).await
    }

    /// Does it; `config` is wholly known. An error is the outcome Terraform reports.
    async fn invoke(&self, config: &Value, progress: &Progress) -> Result<(), Diagnostics>;
}
