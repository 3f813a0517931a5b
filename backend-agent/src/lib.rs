//! The gpufleet control plane and node agent as a library: `gpufleet-agent`'s commands
//! (`serve`, `node`, `fleet`, `nodes`, `pki`, `hw-check`) are thin calls into these
//! modules, so services, agents and the registry are testable and measurable in-process.

// Handlers and their helpers return tonic::Status, the gRPC error type, by value as tonic does.
#![allow(clippy::result_large_err)]

pub mod access;
pub mod agents;
pub mod auth;
pub mod catalog;
pub mod cli;
pub mod client;
pub mod clock;
pub mod drivers;
pub mod error;
pub mod fleet;
pub mod group_commit;
pub mod hardware;
pub mod host;
pub mod inventory;
pub mod kubeconfig;
pub mod limits;
pub mod metrics;
pub mod mig;
pub mod node;
pub mod pki;
pub mod rules;
pub mod scheduling;
pub mod serve;
pub mod services;
pub mod slurm;
pub mod state;
pub mod store;
pub mod tls;
pub mod volumes;
