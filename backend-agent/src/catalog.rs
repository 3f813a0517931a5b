//! The GPU models the control plane knows. Thin view over the model catalog so the
//! rest of the crate asks one place ("is this a model?", "how much memory?").

/// (model name, memory per GPU in MiB as NVML reports it).
const MODELS: &[(&str, u64)] = &[
    ("A100-40GB", 40_960),
    ("A100-80GB", 81_920),
    ("H100-80GB", 81_559),
    ("H100-94GB", 95_830),
    ("H200-141GB", 143_771),
    ("B200", 183_359),
    ("GH200", 97_871),
];

pub fn model_names() -> Vec<&'static str> {
    MODELS.iter().map(|(name, _)| *name).collect()
}

pub fn memory_mib(model: &str) -> Option<u64> {
    MODELS
        .iter()
        .find(|(name, _)| *name == model)
        .map(|(_, mib)| *mib)
}

/// `gpu_type: unknown GPU model 'X' (known: A, B, ...)` when the model is not in the catalog.
pub fn require_known(field: &str, model: &str) -> Result<(), String> {
    if memory_mib(model).is_some() {
        Ok(())
    } else {
        Err(format!(
            "{field}: unknown GPU model '{model}' (known: {})",
            model_names().join(", ")
        ))
    }
}

pub fn mig_capable(_model: &str) -> bool {
    false
}

pub fn mig_profiles(_model: &str) -> Vec<gpufleet_proto::v1::MigProfile> {
    Vec::new()
}
