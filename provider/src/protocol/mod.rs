//! The Terraform plugin protocol, through tf-provider. This is the only module that names
//! `tf_provider`: swapping the protocol library touches nothing else.

mod adapters;
mod convert;
mod nodelay;

use std::sync::Arc;

use crate::framework::ProviderType;

/// Serves `provider` to Terraform under `name` (resource types become `<name>_<type>`)
/// until Terraform stops it.
pub async fn serve(name: &str, provider: Arc<dyn ProviderType>) -> anyhow::Result<()> {
    let adapter = adapters::ProviderAdapter::new(provider);
    nodelay::NoDelay::new(tf_provider::serve(name, adapter)).await
}
