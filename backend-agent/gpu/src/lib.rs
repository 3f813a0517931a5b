//! GPU catalog, MIG placement planner and the node agent's hardware backends.
//!
//! - [`catalog`]: GPU models and their MIG profiles (data from the MIG user guide).
//! - [`mig`]: the exact placement planner (`plan`) and its error/suggestion logic.
//! - [`hardware`]: the `GpuBackend` trait, a rule-enforcing `SimulatedNode`, the NVML
//!   backend, the safe re-partition sequence and the read-only check report.

pub mod catalog;
pub mod hardware;
pub mod mig;
