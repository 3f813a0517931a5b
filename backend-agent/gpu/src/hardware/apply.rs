//! The safe re-partition sequence, on any backend.
//!
//! Like nvidia-mig-parted: refuse while work runs on what would change, enable MIG mode
//! where needed, destroy then create in the planner's order, verify the result, and on
//! any failure roll back to the previous layout so the GPU ends as it started.
//! Instances the new layout keeps unchanged (same profile at the same start) are left
//! alone, so their work and UUIDs survive.

use super::{GpuBackend, GpuInfo, HwError, MigInstance};
use crate::mig::Placement;

/// Re-partitions `gpu` to exactly `placements` (in creation order, as `mig::plan` returns
/// them) and returns the GPU's instances in that order.
pub fn apply_layout(
    backend: &dyn GpuBackend,
    gpu: u32,
    placements: &[Placement],
) -> Result<Vec<MigInstance>, HwError> {
    let before = gpu_info(backend, gpu)?;
    let wanted: Vec<(u32, u8)> = placements.iter().map(|p| (p.profile_id, p.start)).collect();
    // An instance without a MIG device (a GPU instance with no compute instance: no UUID)
    // is incomplete and is recreated, not kept.
    let keep = |i: &MigInstance| wanted.contains(&(i.profile_id, i.start)) && !i.uuid.is_empty();
    let to_destroy: Vec<MigInstance> = before
        .instances
        .iter()
        .filter(|i| !keep(i))
        .cloned()
        .collect();
    let to_create: Vec<&Placement> = placements
        .iter()
        .filter(|p| {
            !before
                .instances
                .iter()
                .any(|i| keep(i) && (i.profile_id, i.start) == (p.profile_id, p.start))
        })
        .collect();

    if before.mig_enabled && to_destroy.is_empty() && to_create.is_empty() {
        return instances_in_order(&before, placements);
    }
    refuse_if_busy(backend, &before, &to_destroy)?;

    let mut journal = Journal::new(before.mig_enabled);
    let result = (|| {
        if !before.mig_enabled {
            // Journaled before the call: a failed enable can leave a pending mode behind,
            // and the rollback must turn it back off.
            journal.mig_enabled = true;
            backend.set_mig_mode(gpu, true)?;
        }
        for inst in to_destroy.iter().rev() {
            backend.destroy_instance(gpu, inst.start)?;
            journal.destroyed.push(inst.clone());
        }
        for p in &to_create {
            backend.create_instance(gpu, p.profile_id, p.start)?;
            journal.created.push(p.start);
        }
        let after = gpu_info(backend, gpu)?;
        verify(&after, &wanted)?;
        instances_in_order(&after, placements)
    })();
    result.map_err(|e| journal.roll_back(backend, gpu, e))
}

/// Returns `gpu` to whole-GPU mode: destroys every instance and turns MIG off, with the
/// same in-use refusal and rollback as `apply_layout`.
pub fn clear_layout(backend: &dyn GpuBackend, gpu: u32) -> Result<(), HwError> {
    let before = gpu_info(backend, gpu)?;
    if !before.mig_enabled {
        return Ok(());
    }
    refuse_if_busy(backend, &before, &before.instances)?;
    let mut journal = Journal::new(true);
    let result = (|| {
        // Smallest first: the reverse of creation order.
        let mut order = before.instances.clone();
        order.sort_by_key(|i| (i.size, i.start));
        for inst in &order {
            backend.destroy_instance(gpu, inst.start)?;
            journal.destroyed.push(inst.clone());
        }
        journal.mig_disabled = true;
        backend.set_mig_mode(gpu, false)?;
        Ok(())
    })();
    result.map_err(|e| journal.roll_back(backend, gpu, e))
}

/// This GPU alone: another GPU of the node that cannot be read does not block it.
fn gpu_info(backend: &dyn GpuBackend, gpu: u32) -> Result<GpuInfo, HwError> {
    backend.gpu(gpu)
}

/// HwError::InUse naming every instance (or the whole GPU) that runs work and would change.
fn refuse_if_busy(
    backend: &dyn GpuBackend,
    gpu: &GpuInfo,
    affected: &[MigInstance],
) -> Result<(), HwError> {
    let busy = backend.busy(gpu.index)?;
    let mut names = Vec::new();
    if busy.whole_gpu && !gpu.mig_enabled {
        names.push(format!("GPU {} ({}) as a whole", gpu.index, gpu.uuid));
    }
    for inst in affected
        .iter()
        .filter(|i| busy.instance_starts.contains(&i.start))
    {
        names.push(describe(inst));
    }
    if names.is_empty() {
        Ok(())
    } else {
        Err(HwError::InUse {
            gpu: gpu.index,
            instances: names,
        })
    }
}

fn describe(inst: &MigInstance) -> String {
    format!("{}@{} ({})", inst.profile, inst.start, inst.uuid)
}

/// The GPU must hold exactly the requested (profile, start) pairs.
fn verify(after: &GpuInfo, wanted: &[(u32, u8)]) -> Result<(), HwError> {
    let mut have: Vec<(u32, u8)> = after
        .instances
        .iter()
        .map(|i| (i.profile_id, i.start))
        .collect();
    let mut want = wanted.to_vec();
    have.sort_unstable();
    want.sort_unstable();
    if have == want && after.mig_enabled {
        return Ok(());
    }
    let show = |v: &[(u32, u8)]| {
        v.iter()
            .map(|(id, s)| format!("{id}@{s}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(HwError::Rule(format!(
        "verification: gpu {} holds [{}] (profile id@start), requested [{}]",
        after.index,
        show(&have),
        show(&want)
    )))
}

fn instances_in_order(
    info: &GpuInfo,
    placements: &[Placement],
) -> Result<Vec<MigInstance>, HwError> {
    placements
        .iter()
        .map(|p| {
            info.instances
                .iter()
                .find(|i| i.start == p.start && i.profile_id == p.profile_id)
                .cloned()
                .ok_or_else(|| {
                    HwError::Rule(format!(
                        "verification: gpu {} has no {}@{} after applying",
                        info.index, p.profile, p.start
                    ))
                })
        })
        .collect()
}

/// What a sequence changed so far, to undo it in reverse.
struct Journal {
    mig_was_enabled: bool,
    mig_enabled: bool,
    mig_disabled: bool,
    destroyed: Vec<MigInstance>,
    created: Vec<u8>,
}

impl Journal {
    fn new(mig_was_enabled: bool) -> Self {
        Self {
            mig_was_enabled,
            mig_enabled: false,
            mig_disabled: false,
            destroyed: Vec::new(),
            created: Vec::new(),
        }
    }

    /// Undoes every recorded step; returns `cause` annotated with the outcome.
    fn roll_back(self, backend: &dyn GpuBackend, gpu: u32, cause: HwError) -> HwError {
        if self.created.is_empty()
            && self.destroyed.is_empty()
            && !self.mig_enabled
            && !self.mig_disabled
        {
            return cause;
        }
        let mut failures = Vec::new();
        if self.mig_disabled {
            if let Err(e) = backend.set_mig_mode(gpu, true) {
                failures.push(format!("re-enabling MIG: {e}"));
            }
        }
        for &start in self.created.iter().rev() {
            if let Err(e) = backend.destroy_instance(gpu, start) {
                failures.push(format!("destroying the new instance at slice {start}: {e}"));
            }
        }
        // Recreate larger instances first, as the hardware needs.
        let mut restore = self.destroyed.clone();
        restore.sort_by_key(|i| (std::cmp::Reverse(i.size), i.start));
        for inst in &restore {
            if let Err(e) = backend.create_instance(gpu, inst.profile_id, inst.start) {
                failures.push(format!("recreating {}: {e}", describe(inst)));
            }
        }
        if self.mig_enabled && !self.mig_was_enabled {
            if let Err(e) = backend.set_mig_mode(gpu, false) {
                failures.push(format!("turning MIG back off: {e}"));
            }
        }
        let note = if failures.is_empty() {
            "rolled back to the previous layout".to_string()
        } else {
            let now = gpu_info(backend, gpu)
                .map(|g| {
                    g.instances
                        .iter()
                        .map(describe)
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_else(|e| format!("unknown ({e})"));
            format!(
                "rollback failed ({}); the GPU now holds [{}]",
                failures.join("; "),
                now
            )
        };
        annotate(cause, &note)
    }
}

/// Appends `note` to the error's message, keeping its kind.
fn annotate(e: HwError, note: &str) -> HwError {
    match e {
        HwError::NoDriver(m) => HwError::NoDriver(format!("{m}; {note}")),
        HwError::Rule(m) => HwError::Rule(format!("{m}; {note}")),
        HwError::Injected(m) => HwError::Injected(format!("{m}; {note}")),
        HwError::Nvml(m) => HwError::Nvml(format!("{m}; {note}")),
        HwError::Unsupported(m) => HwError::Unsupported(format!("{m}; {note}")),
        HwError::InUse { gpu, mut instances } => {
            if let Some(last) = instances.last_mut() {
                last.push_str(&format!(" ({note})"));
            }
            HwError::InUse { gpu, instances }
        }
        HwError::InvalidGpu(g) => HwError::InvalidGpu(g),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog;
    use crate::hardware::SimulatedNode;
    use crate::mig::{plan, Layout};

    fn node() -> SimulatedNode {
        SimulatedNode::new(
            "node-a",
            catalog::model("H100-80GB").unwrap(),
            2,
            "550.54.15",
        )
    }

    fn placements(items: &[(&str, u32)]) -> Vec<Placement> {
        let l: Layout = items.iter().map(|(n, c)| (n.to_string(), *c)).collect();
        plan(catalog::model("H100-80GB").unwrap(), &l).unwrap()
    }

    #[test]
    fn applies_from_whole_gpu() {
        let n = node();
        let ps = placements(&[("3g.40gb", 1), ("2g.20gb", 1), ("1g.10gb", 2)]);
        let made = apply_layout(&n, 0, &ps).unwrap();
        assert_eq!(made.len(), 4);
        assert_eq!(made[0].profile, "3g.40gb");
        let g = &n.gpus().unwrap()[0];
        assert!(g.mig_enabled);
        assert_eq!(g.instances.len(), 4);
        // Applying the same layout again changes nothing and returns the same instances.
        assert_eq!(apply_layout(&n, 0, &ps).unwrap(), made);
    }

    #[test]
    fn rollback_after_mid_sequence_failure_restores_the_previous_layout() {
        let n = node();
        apply_layout(&n, 0, &placements(&[("3g.40gb", 2)])).unwrap();
        let before = n.gpus().unwrap();
        // New layout destroys both 3g and creates four instances; the third create fails.
        n.fail_create_at(3, "simulated NVML_ERROR_UNKNOWN");
        let err = apply_layout(&n, 0, &placements(&[("2g.20gb", 3), ("1g.10gb", 1)])).unwrap_err();
        match &err {
            HwError::Injected(m) => {
                assert!(
                    m.contains("simulated NVML_ERROR_UNKNOWN; rolled back to the previous layout"),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(n.gpus().unwrap(), before);
    }

    #[test]
    fn rollback_turns_mig_back_off() {
        let n = node();
        let before = n.gpus().unwrap();
        n.fail_create_at(2, "boom");
        assert!(apply_layout(&n, 1, &placements(&[("4g.40gb", 1), ("3g.40gb", 1)])).is_err());
        assert_eq!(n.gpus().unwrap(), before);
        assert!(!n.gpus().unwrap()[1].mig_enabled);
    }

    #[test]
    fn in_use_refusal_names_instances_and_changes_nothing() {
        let n = node();
        apply_layout(&n, 0, &placements(&[("3g.40gb", 1), ("4g.40gb", 1)])).unwrap();
        n.set_in_use(0, 4, true);
        let before = n.gpus().unwrap();
        let err = apply_layout(&n, 0, &placements(&[("7g.80gb", 1)])).unwrap_err();
        match &err {
            HwError::InUse { gpu: 0, instances } => {
                assert_eq!(instances.len(), 1);
                assert!(
                    instances[0].starts_with("3g.40gb@4 (MIG-"),
                    "{}",
                    instances[0]
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(n.gpus().unwrap(), before);
        assert!(matches!(clear_layout(&n, 0), Err(HwError::InUse { .. })));
        assert_eq!(n.gpus().unwrap(), before);
    }

    #[test]
    fn busy_instance_that_stays_does_not_block() {
        let n = node();
        apply_layout(&n, 0, &placements(&[("4g.40gb", 1), ("3g.40gb", 1)])).unwrap();
        let kept = n.gpus().unwrap()[0].instances[0].clone();
        n.set_in_use(0, 0, true);
        // 4g@0 stays; 3g@4 becomes 2g@4 + 1g.20gb@6.
        let made = apply_layout(
            &n,
            0,
            &placements(&[("4g.40gb", 1), ("2g.20gb", 1), ("1g.20gb", 1)]),
        )
        .unwrap();
        assert_eq!(made[0], kept);
        assert_eq!(made.len(), 3);
    }

    #[test]
    fn whole_gpu_in_use_blocks_enabling_mig() {
        let n = node();
        n.set_gpu_in_use(1, true);
        match apply_layout(&n, 1, &placements(&[("7g.80gb", 1)])) {
            Err(HwError::InUse { gpu: 1, instances }) => {
                assert!(instances[0].contains("as a whole"))
            }
            other => panic!("{other:?}"),
        }
        assert!(!n.gpus().unwrap()[1].mig_enabled);
    }

    #[test]
    fn clear_layout_and_its_rollback() {
        let n = node();
        apply_layout(&n, 0, &placements(&[("2g.20gb", 3)])).unwrap();
        let before = n.gpus().unwrap();
        n.fail_next_destroy("driver hiccup");
        // The first destroy fails: nothing was changed, so the error is plain.
        assert_eq!(
            clear_layout(&n, 0),
            Err(HwError::Injected("driver hiccup".into()))
        );
        assert_eq!(n.gpus().unwrap(), before);
        clear_layout(&n, 0).unwrap();
        let g = &n.gpus().unwrap()[0];
        assert!(!g.mig_enabled && g.instances.is_empty());
        clear_layout(&n, 0).unwrap();
    }

    #[test]
    fn a_planner_bug_shows_up_as_a_failed_apply() {
        // Overlapping placements (as a buggy planner might return) are refused by the node.
        let n = node();
        let bad = vec![
            Placement {
                profile: "3g.40gb".into(),
                profile_id: 9,
                start: 0,
                size: 4,
            },
            Placement {
                profile: "4g.40gb".into(),
                profile_id: 5,
                start: 0,
                size: 4,
            },
        ];
        let before = n.gpus().unwrap();
        match apply_layout(&n, 0, &bad) {
            Err(HwError::Rule(m)) => {
                assert!(m.contains("overlaps") && m.contains("rolled back"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(n.gpus().unwrap(), before);
    }

    #[test]
    fn invalid_gpu() {
        assert_eq!(apply_layout(&node(), 7, &[]), Err(HwError::InvalidGpu(7)));
    }
}
