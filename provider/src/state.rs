//! What the resources and data sources share: the backend client that the provider's
//! `configure` makes, and what this run plans and does. It knows no resource, no data
//! source and not the provider block (`provider.rs` registers them all above it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::client::Client;
use crate::framework::{Diagnostic, Diagnostics};

/// What resources share: the client made by `configure`.
#[derive(Default)]
pub struct ProviderState {
    client: RwLock<Option<Arc<Client>>>,
    /// False when the provider block had values unknown until apply.
    config_known: RwLock<bool>,
    /// What this run's other resources plan and do.
    pub run: crate::this_run::ThisRun,
    /// The provider's `store_credentials_in_state = true`: credential attributes are kept
    /// in state. Otherwise (the default) they are answered null (`resources::credentials`).
    keep_credentials: AtomicBool,
}

impl ProviderState {
    /// The configured client, or an error saying the provider was not configured.
    pub fn client(&self) -> Result<Arc<Client>, Diagnostics> {
        self.client
            .read()
            .ok()
            .and_then(|c| c.clone())
            .ok_or_else(|| {
                Diagnostic::error(
                    "the gpufleet provider is not configured yet",
                    "Its configuration depends on values known only after apply.",
                )
                .into()
            })
    }

    /// The client for plan-time checks: `None` when the provider configuration is not
    /// fully known yet (the checks then happen at apply, in the backend).
    pub fn plan_client(&self) -> Option<Arc<Client>> {
        if *self.config_known.read().ok()? {
            self.client().ok()
        } else {
            None
        }
    }

    /// Whether resources keep credentials (tokens, kubeconfigs) in state.
    pub fn keeps_credentials(&self) -> bool {
        self.keep_credentials.load(Ordering::Relaxed)
    }

    pub(crate) fn set_keeps_credentials(&self, keep: bool) {
        self.keep_credentials.store(keep, Ordering::Relaxed);
    }

    pub(crate) fn set(&self, client: Client, known: bool) {
        if let Ok(mut slot) = self.client.write() {
            *slot = Some(Arc::new(client));
        }
        if let Ok(mut slot) = self.config_known.write() {
            *slot = known;
        }
    }
}
