//! The gpufleet control plane: the gRPC API (`services`) over durable state (`store`,
//! `state`), admission and scheduling (`scheduling`, `rules`, `mig`), the registry of the
//! node agents that connect to it (`agents`), Slurm controllers for tenant clusters
//! (`slurm_clusters`) and its metrics (`metrics`). It changes GPUs only through work
//! orders to node agents, and knows them only through the agent protocol: it does not
//! depend on the node agent crate. `serve` assembles it from a [`serve::Config`].

// Handlers and their helpers return tonic::Status, the gRPC error type, by value as tonic does.
#![allow(clippy::result_large_err)]

pub mod access;
pub mod agents;
pub mod audit;
pub mod auth;
pub mod catalog;
pub mod clock;
pub mod cluster_status;
pub mod connections;
pub mod counters;
pub mod deadlines;
pub mod drivers;
pub mod error;
pub mod fingerprint;
pub mod fleet;
pub mod group_commit;
pub mod host;
pub mod intent;
pub mod invariants;
pub mod join_tokens;
pub mod kubeconfig;
pub mod lease;
pub mod limits;
pub mod message_cut;
pub mod metering;
pub mod metrics;
pub mod mig;
pub mod node_volumes;
pub mod recorded;
pub mod registry;
pub mod rules;
pub mod scheduling;
pub mod secrets;
pub mod serve;
pub mod services;
pub mod slurm_clusters;
pub mod slurm_tracker;
pub mod state;
pub mod store;
pub mod takeover;
pub mod telemetry;
pub mod tls_reload;
pub mod usage_cost;
pub mod volume_use;
pub mod volumes;
