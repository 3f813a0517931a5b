//! MIG partitioning of cluster GPUs.

use std::collections::HashMap;

use gpufleet_proto::v1;
use tonic::Status;

pub fn check(
    _gpu_type: &str,
    _layout: &HashMap<String, i32>,
) -> Result<v1::CheckMigLayoutResponse, Status> {
    Err(Status::unimplemented(
        "MIG layout checks are not available yet",
    ))
}

/// Validates a cluster's per-GPU layout; empty means whole GPUs.
pub fn validate(
    _gpu_type: &str,
    layout: &HashMap<String, i32>,
) -> Result<std::collections::BTreeMap<String, u32>, Status> {
    if layout.is_empty() {
        return Ok(Default::default());
    }
    Err(Status::failed_precondition(
        "mig_layout: MIG partitioning is not available yet",
    ))
}
