//! End-to-end harness: the real backend binary, the real provider binary and real Terraform.
//!
//! - [`Backend`] starts `gpufleet-agent serve` on a free port with a temp data dir and stops it
//!   on drop; [`Backend::restart`] keeps the data dir and the address;
//!   [`Backend::start_with_tls`] serves over TLS with a [`ServerTls`] from [`pki`].
//! - [`NodeAgent`] runs one `gpufleet-agent node` process (simulated GPUs) against a
//!   backend, to kill and restart like a host; [`eventually`] waits on a condition.
//! - [`Clients`] are the gRPC service clients that carry a bearer token on every call.
//! - [`checker`] is the randomized concurrent checker: clients of several tenants against
//!   a serve killed with `kill -9`, then `gpufleet-agent check` on the store and their
//!   acknowledged answers.
//! - [`hcl`] builds configurations from resource, data and output blocks.
//! - [`Terraform`] is one Terraform working directory wired to the provider binary through
//!   `dev_overrides`, with methods that run Terraform and fail with its output.
//!
//! - [`netns`] is the multi-host tier's network: hosts as network namespaces on one
//!   bridge; [`Backend::start_on`], [`NodeAgent::start_on`] and [`Terraform::on_host`]
//!   run the same parts on those hosts, reaching each other only by address;
//!   [`slurm_login`] is a team's ssh session to its Slurm cluster's login there, and
//!   [`slurm_jobs`] reads what its batch jobs left.
//!
//! Binaries are found by env var (`GPUFLEET_AGENT_BIN`, `GPUFLEET_PROVIDER_BIN`,
//! `TERRAFORM_BIN`), else in the workspace's build output (see [`binaries`]).
//!
//! Tests use `#[tokio::test(flavor = "multi_thread")]`: Terraform runs and backend restarts
//! block the test's thread, and meanwhile the gRPC connections' tasks must keep running (a
//! SIGTERMed agent waits for its clients to answer the shutdown's GOAWAY).

pub mod backend;
pub mod binaries;
pub mod checker;
pub mod commands;
pub mod fixtures;
pub mod grpc;
pub mod hcl;
pub mod json;
pub mod mirror;
pub mod multihost;
pub mod netns;
pub mod node_agent;
pub mod patroni;
pub mod pki;
pub mod prom;
pub mod recipe;
pub mod recipe_site;
pub mod replicas;
pub mod shared_storage;
pub mod slurm_jobs;
pub mod slurm_login;
pub mod terraform;
pub mod times;

pub use backend::{Backend, LogOnPanic};
pub use grpc::Clients;
pub use node_agent::{eventually, NodeAgent};
pub use pki::ServerTls;
pub use terraform::{Terraform, TfRun};
