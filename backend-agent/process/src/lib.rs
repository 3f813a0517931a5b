//! What a long-running gpufleet process (the control plane, a node agent) needs around its
//! work, and nothing of that work: one process per data dir, stopping on signals, and the
//! metrics endpoint.

pub mod data_dir;
pub mod metrics_endpoint;
pub mod signals;
