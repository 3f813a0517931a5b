//! The GPU models the control plane knows: a thin view over `gpufleet_gpu::catalog`, so
//! the rest of the crate asks one place ("is this a model?", "how much memory?").

use gpufleet_gpu::catalog;
use gpufleet_proto::v1;

pub fn model_names() -> Vec<&'static str> {
    catalog::model_names()
}

pub fn memory_mib(model: &str) -> Option<u64> {
    catalog::model(model).map(|m| m.memory_mib)
}

/// `gpu_type: unknown GPU model 'X' (known: A, B, ...)` when the model is not in the catalog.
pub fn require_known(field: &str, model: &str) -> Result<(), String> {
    if catalog::model(model).is_some() {
        Ok(())
    } else {
        Err(format!(
            "{field}: unknown GPU model '{model}' (known: {})",
            model_names().join(", ")
        ))
    }
}

pub fn mig_capable(model: &str) -> bool {
    catalog::model(model).is_some_and(|m| m.mig_capable)
}

pub fn mig_profiles(model: &str) -> Vec<v1::MigProfile> {
    let Some(m) = catalog::model(model) else {
        return Vec::new();
    };
    m.profiles
        .iter()
        .map(|p| v1::MigProfile {
            id: p.id as i32,
            name: p.name.clone(),
            compute_slices: p.compute_slices as i32,
            memory_slices: p.memory_slices as i32,
            valid_starts: p.valid_starts.iter().map(|s| *s as i32).collect(),
            max_per_gpu: p.max_per_gpu as i32,
            memory_mib: p.memory_mib as i64,
        })
        .collect()
}
