//! terraform-provider-gpufleet: the Terraform provider for gpufleet.

mod client;
mod convert;
mod data_sources;
mod framework;
mod protocol;
mod provider;
mod resources;
mod this_run;
mod times;
mod validation;

use std::sync::Arc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    protocol::serve("gpufleet", Arc::new(provider::GpufleetProvider::new())).await
}
