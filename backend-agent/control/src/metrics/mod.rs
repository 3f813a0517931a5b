//! The control plane's Prometheus metrics, served by `gpufleet_process::metrics_endpoint`:
//!
//! - [`control`]: counters and the request histogram live in one process-wide registry and
//!   are counted where things happen (the API layer, the places that wait for work
//!   orders); the gauges (GPUs, MIG slices, tenants' usage and quotas, reservations, nodes,
//!   heartbeat ages) are computed from the store at scrape time, with one short read on a
//!   blocking thread.
//! - [`breaker`]: the automatic-quarantine breakers, per GPU model.
//! - [`usage`]: GPU-seconds held and used per tenant, model and capacity class, from the
//!   store (in both views: a team's has its own).
//! - [`team`]: a tenant's own view (its clusters, GPUs, MIG slices, checks, quota use).
//! - [`view`]: which of the two a scrape gets, by its bearer token.
//! - [`api`]: the tower layer around the gRPC server that counts requests by method and
//!   gRPC status code and times them.

pub mod api;
pub mod breaker;
pub mod control;
pub mod team;
pub mod usage;
pub mod view;
