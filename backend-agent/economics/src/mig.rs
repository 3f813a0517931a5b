//! MIG slices in a trace: a job may ask for N instances of one MIG profile of its model
//! instead of whole GPUs. The control plane holds a MIG cluster's nodes whole, every GPU
//! cut into its layout, so such a job is admitted as a cluster whose layout fills each
//! GPU with its profile (the most instances of it one GPU holds, a layout the control
//! plane's planner accepts: `gpufleet_control::mig::validate`) on the GPUs that hold its
//! N instances: `ceil(N / per GPU)`, in whole nodes as every job. Its demand in
//! GPU-equivalents is `N / per GPU` (the part of the GPUs its instances fill), in both
//! the pooled and the partitioned replay.
//!
//! Alibaba's `gpu_milli` (a pod's share of one GPU), where the fleet asks for it, is the
//! smallest MIG instance whose compute covers it: `ceil(gpu_milli x 7 / 1000)` compute
//! slices of the 7, the first profile of that many compute slices in the catalog (`1g`,
//! `2g`, `3g`, `4g`); a share past 4/7 of a GPU takes the whole GPU.

use std::collections::HashMap;

use gpufleet_gpu::catalog;

/// What one job asks of MIG: `count` instances of `profile`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Slices {
    pub profile: String,
    pub count: i64,
    /// Instances of the profile one GPU holds (the layout each of the job's GPUs gets).
    pub per_gpu: i64,
}

impl Slices {
    /// `count` instances of `profile` on `gpu_type`; refused ("mig_profile: reason")
    /// when the model has no MIG or no such profile, or the control plane's planner
    /// would refuse the layout.
    pub fn ask(gpu_type: &str, profile: &str, count: i64) -> Result<Self, String> {
        let model = catalog::model(gpu_type)
            .ok_or_else(|| format!("mig_profile: {gpu_type} is not a known GPU model"))?;
        if !model.mig_capable {
            return Err(format!(
                "mig_profile: {gpu_type} has no MIG; leave the column empty for whole GPUs"
            ));
        }
        let found = model.profile(profile).ok_or_else(|| {
            format!(
                "mig_profile: '{}' is not a MIG profile of {gpu_type} (its profiles: {})",
                profile.chars().take(40).collect::<String>(),
                model.profile_names().join(", ")
            )
        })?;
        let per_gpu = i64::from(found.max_per_gpu);
        let layout = HashMap::from([(profile.to_string(), found.max_per_gpu.into())]);
        gpufleet_control::mig::validate(gpu_type, &layout).map_err(|e| e.to_string())?;
        Ok(Self {
            profile: profile.to_string(),
            count,
            per_gpu,
        })
    }

    /// The GPUs that hold the instances (each GPU filled with the profile).
    pub fn gpus(&self) -> i64 {
        (self.count + self.per_gpu - 1) / self.per_gpu
    }

    /// The part of GPUs the instances fill.
    pub fn gpu_equivalent(&self) -> f64 {
        self.count as f64 / self.per_gpu as f64
    }
}

/// The profile of `gpu_type` whose instance covers `gpu_milli` thousandths of a GPU's
/// compute; None when the model has no MIG or the share needs more than 4 of the 7
/// compute slices (a whole GPU then).
pub fn profile_for_share(gpu_type: &str, gpu_milli: i64) -> Option<String> {
    let model = catalog::model(gpu_type).filter(|m| m.mig_capable)?;
    let compute = (gpu_milli * 7 + 999) / 1000;
    model
        .profiles
        .iter()
        .find(|p| i64::from(p.compute_slices) == compute.max(1) && compute <= 4)
        .map(|p| p.name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_fills_each_gpu_with_as_many_instances_as_fit() {
        let s = Slices::ask("H100-80GB", "1g.10gb", 10).unwrap();
        assert_eq!((s.per_gpu, s.gpus()), (7, 2));
        assert!((s.gpu_equivalent() - 10.0 / 7.0).abs() < 1e-12);
        let s = Slices::ask("H100-80GB", "3g.40gb", 3).unwrap();
        assert_eq!((s.per_gpu, s.gpus(), s.gpu_equivalent()), (2, 2, 1.5));
        assert_eq!(Slices::ask("H100-80GB", "7g.80gb", 1).unwrap().gpus(), 1);
    }

    #[test]
    fn a_profile_the_model_has_not_is_refused_naming_its_profiles() {
        let e = Slices::ask("H100-80GB", "1g.5gb", 1).unwrap_err();
        assert!(
            e.starts_with(
                "mig_profile: '1g.5gb' is not a MIG profile of H100-80GB (its profiles: 1g.10gb, "
            ),
            "{e}"
        );
        assert_eq!(
            Slices::ask("L40S", "1g.10gb", 1).unwrap_err(),
            "mig_profile: L40S has no MIG; leave the column empty for whole GPUs"
        );
    }

    /// 1/7 of a GPU is 142.9 thousandths: 142 takes a 1g, 143 a 2g; past 4/7 (571.4) the
    /// whole GPU.
    #[test]
    fn a_share_of_a_gpu_is_the_smallest_instance_that_covers_it() {
        let of = |milli| profile_for_share("H100-80GB", milli);
        assert_eq!(of(1).as_deref(), Some("1g.10gb"));
        assert_eq!(of(142).as_deref(), Some("1g.10gb"));
        assert_eq!(of(143).as_deref(), Some("2g.20gb"));
        assert_eq!(of(428).as_deref(), Some("3g.40gb"));
        assert_eq!(of(571).as_deref(), Some("4g.40gb"));
        assert_eq!(of(572), None);
        assert_eq!(profile_for_share("L40S", 100), None);
    }
}
