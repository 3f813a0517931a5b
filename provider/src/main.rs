//! terraform-provider-gpufleet: the Terraform provider for gpufleet.

mod actions;
mod client;
mod convert;
mod data_sources;
mod ephemeral;
mod failover;
mod framework;
mod lists;
mod protocol;
mod provider;
mod resources;
mod state;
mod this_run;
mod times;
mod validation;

use std::process::ExitCode;
use std::sync::Arc;

#[tokio::main]
async fn main() -> ExitCode {
    match protocol::serve("gpufleet", Arc::new(provider::GpufleetProvider::new())).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            match e.downcast_ref::<protocol::Refused>() {
                Some(refused) => eprintln!("{refused}"),
                None => eprintln!("terraform-provider-gpufleet: {e:#}"),
            }
            ExitCode::FAILURE
        }
    }
}
