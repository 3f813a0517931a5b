//! GPU catalog, MIG placement planner and the node agent's hardware backends.
//!
//! - [`catalog`]: GPU models and their MIG profiles (data from the MIG user guide).
//! - [`mig`]: the exact placement planner (`plan`) and its error/suggestion logic.
//! - [`hardware`]: the `GpuBackend` trait, a rule-enforcing `SimulatedNode`, the NVML
//!   backend, the safe re-partition sequence and the read-only check report.
//! - [`figures`]: what a healthy GPU of each model delivers under load, with sources.
//! - [`load`]: the load tests (memory, GEMM burn, bandwidths, all-reduce) behind one
//!   trait, simulated or through CUDA loaded at run time.

pub mod catalog;
pub mod figures;
pub mod hardware;
pub mod load;
pub mod mig;
