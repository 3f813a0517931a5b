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

/// `gpu_type: unknown GPU model 'X' (known: A, B, ...)` when the model is not in the catalog,
/// with `did you mean 'A'?` for a name that differs only in case (names are case-sensitive).
pub fn require_known(field: &str, model: &str) -> Result<(), String> {
    if catalog::model(model).is_some() {
        return Ok(());
    }
    let names = model_names();
    let meant = names.iter().find(|n| n.eq_ignore_ascii_case(model));
    let hint = meant.map_or(String::new(), |m| format!("did you mean '{m}'? "));
    Err(format!(
        "{field}: unknown GPU model '{model}' ({hint}known: {})",
        names.join(", ")
    ))
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

#[cfg(test)]
mod tests {
    use super::require_known;

    #[test]
    fn a_model_in_the_wrong_case_is_refused_naming_the_right_one() {
        let refused = require_known("gpu_type", "h100-80gb").unwrap_err();
        assert!(
            refused.starts_with(
                "gpu_type: unknown GPU model 'h100-80gb' (did you mean 'H100-80GB'? known: "
            ),
            "{refused}"
        );
        assert!(!require_known("gpu_type", "V100")
            .unwrap_err()
            .contains("did you mean"));
        assert!(require_known("gpu_type", "H100-80GB").is_ok());
    }
}
