//! MIG partitioning of cluster GPUs: layout checks through the planner, and applying a
//! layout on the hardware of a cluster's nodes (simulated, or this host through NVML
//! with `--hardware nvml`), recorded in the store only after the hardware succeeded.
//!
//! Fault injection (simulated nodes only, for tests; real nodes ignore it): before each
//! MIG change the control plane reads `<data-dir>/sim-faults.toml` when it exists:
//!
//! ```toml
//! fail_create_after = 2                  # the 3rd instance create of this request fails
//! in_use = ["h100-80gb-pool-01:0"]       # these GPUs report work running on them
//! ```
//!
//! A failure rolls every GPU this request already changed back to its previous layout.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use gpufleet_gpu::hardware::{
    apply_layout, clear_layout, GpuBackend, GpuInfo, HwError, SimulatedNode,
};
use gpufleet_gpu::mig::{self, Layout, Placement};
use gpufleet_proto::v1;
use rusqlite::Connection;
use serde::Deserialize;
use tonic::Status;

use crate::state::{db_error, AppState};
use crate::store::{self, nodes::NodeRow};

fn to_layout(layout: &HashMap<String, i32>) -> Result<Layout, Status> {
    layout
        .iter()
        .map(|(name, &count)| {
            u32::try_from(count)
                .map(|c| (name.clone(), c))
                .map_err(|_| {
                    Status::invalid_argument(format!(
                        "mig_layout: count of \"{name}\" must be at least 0 (got {count})"
                    ))
                })
        })
        .collect()
}

fn model(gpu_type: &str) -> Result<&'static gpufleet_gpu::catalog::GpuModel, Status> {
    gpufleet_gpu::catalog::model(gpu_type).ok_or_else(|| {
        Status::invalid_argument(crate::catalog::require_known("gpu_type", gpu_type).unwrap_err())
    })
}

/// FleetService.CheckMigLayout: does the layout fit one GPU, and how.
pub fn check(
    gpu_type: &str,
    layout: &HashMap<String, i32>,
) -> Result<v1::CheckMigLayoutResponse, Status> {
    let layout = to_layout(layout)?;
    let model = model(gpu_type)?;
    Ok(match mig::plan(model, &layout) {
        // Not a layout that does not fit: the question has no answer on this model.
        Err(e) if !model.mig_capable => return Err(Status::invalid_argument(e.reason)),
        Ok(placements) => v1::CheckMigLayoutResponse {
            fits: true,
            placements: placements
                .into_iter()
                .map(|p| v1::MigPlacement {
                    profile: p.profile,
                    profile_id: p.profile_id as i32,
                    start: p.start as i32,
                    size: p.size as i32,
                })
                .collect(),
            ..Default::default()
        },
        Err(e) => v1::CheckMigLayoutResponse {
            fits: false,
            reason: e.reason,
            suggestions: e.suggestions.iter().map(mig::render_layout).collect(),
            ..Default::default()
        },
    })
}

/// A cluster's per-GPU layout, validated by the planner; empty means whole GPUs.
pub fn validate(gpu_type: &str, layout: &HashMap<String, i32>) -> Result<Layout, Status> {
    let layout = to_layout(layout)?;
    if layout.is_empty() {
        return Ok(layout);
    }
    mig::plan(model(gpu_type)?, &layout).map_err(|e| {
        let text = e.to_string();
        Status::invalid_argument(if text.starts_with("mig_layout:") {
            text
        } else {
            format!("mig_layout: {text}")
        })
    })?;
    Ok(layout)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Faults {
    fail_create_after: Option<u32>,
    #[serde(default)]
    in_use: Vec<String>,
}

fn read_faults(data_dir: &Path) -> Result<Faults, Status> {
    let path = data_dir.join("sim-faults.toml");
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            toml::from_str(&text).map_err(|e| Status::internal(format!("{}: {e}", path.display())))
        }
        Err(_) => Ok(Faults::default()),
    }
}

fn hw_status(host: &str, gpu: u32, e: HwError) -> Status {
    let text = format!(
        "mig_layout: {host} GPU {gpu}: {e}; the GPUs this request had changed were rolled back to their previous layout"
    );
    match e {
        HwError::InUse { .. } | HwError::Rule(_) => Status::failed_precondition(text),
        _ => Status::aborted(text),
    }
}

/// The previous layout of a GPU, as placements in creation order (larger first).
fn placements_of(info: &GpuInfo) -> Vec<Placement> {
    let mut p: Vec<Placement> = info
        .instances
        .iter()
        .map(|i| Placement {
            profile: i.profile.clone(),
            profile_id: i.profile_id,
            start: i.start,
            size: i.size,
        })
        .collect();
    p.sort_by_key(|p| (std::cmp::Reverse(p.size), p.start));
    p
}

/// Applies `layout` to every GPU of `nodes` and clears `released` to whole GPUs, then
/// records the hardware's resulting state in the store (inside the caller's transaction).
pub fn sync(
    state: &AppState,
    conn: &Connection,
    gpu_type: &str,
    nodes: &[NodeRow],
    layout: &Layout,
    released: &[NodeRow],
) -> Result<(), Status> {
    let faults = read_faults(&state.data_dir)?;
    let placements = if layout.is_empty() {
        None
    } else {
        Some(
            mig::plan(model(gpu_type)?, layout)
                .map_err(|e| Status::invalid_argument(format!("mig_layout: {e}")))?,
        )
    };
    let targets: Vec<(&NodeRow, Option<&[Placement]>)> = nodes
        .iter()
        .map(|n| (n, placements.as_deref()))
        .chain(released.iter().map(|n| (n, None)))
        .collect();
    let mut changed: Vec<(Arc<dyn GpuBackend>, GpuInfo)> = Vec::new();
    let mut marked_busy: Vec<(Arc<SimulatedNode>, u32)> = Vec::new();
    let mut armed: Vec<Arc<SimulatedNode>> = Vec::new();
    let mut creates = 0u32;
    let mut outcome = Ok(());
    'nodes: for (node, wanted) in &targets {
        let hw = state
            .hardware
            .node(&node.id)
            .ok_or_else(|| Status::internal(format!("no hardware for node {}", node.hostname)))?;
        let backend = hw.backend();
        // Faults are injected into simulated nodes only.
        let sim = hw.simulated();
        let before = backend
            .gpus()
            .map_err(|e| hw_status(&node.hostname, 0, e))?;
        for gpu in before {
            if let Some(sim) = sim {
                if faults
                    .in_use
                    .contains(&format!("{}:{}", node.hostname, gpu.index))
                {
                    sim.set_gpu_in_use(gpu.index, true);
                    marked_busy.push((sim.clone(), gpu.index));
                }
            }
            let result = match wanted {
                Some(p) => {
                    let new = p
                        .iter()
                        .filter(|pl| {
                            !gpu.instances
                                .iter()
                                .any(|i| (i.profile_id, i.start) == (pl.profile_id, pl.start))
                        })
                        .count() as u32;
                    if let (Some(limit), Some(sim)) = (faults.fail_create_after, sim) {
                        if creates + new > limit {
                            sim.fail_create_at(
                                limit - creates + 1,
                                "sim-faults.toml: fail_create_after",
                            );
                            armed.push(sim.clone());
                        }
                    }
                    apply_layout(&*backend, gpu.index, p).map(|_| new)
                }
                None => clear_layout(&*backend, gpu.index).map(|_| 0),
            };
            match result {
                Ok(new) => {
                    creates += new;
                    changed.push((backend.clone(), gpu));
                }
                Err(e) => {
                    outcome = Err(hw_status(&node.hostname, gpu.index, e));
                    break 'nodes;
                }
            }
        }
    }
    for (sim, gpu) in &marked_busy {
        sim.set_gpu_in_use(*gpu, false);
    }
    for sim in &armed {
        // Disarm a fault that did not fire in this request.
        sim.fail_create_at(u32::MAX, "disarmed");
    }
    if let Err(status) = outcome {
        for (backend, before) in changed.iter().rev() {
            let restored = if before.mig_enabled {
                apply_layout(&**backend, before.index, &placements_of(before)).map(|_| ())
            } else {
                clear_layout(&**backend, before.index)
            };
            if let Err(e) = restored {
                tracing::error!(host = %backend.hostname(), gpu = before.index, error = %e, "rollback of a MIG change failed");
            }
        }
        return Err(status);
    }
    for (node, _) in &targets {
        let backend = state
            .hardware
            .node(&node.id)
            .expect("checked above")
            .backend();
        for gpu in backend
            .gpus()
            .map_err(|e| hw_status(&node.hostname, 0, e))?
        {
            store::nodes::set_mig_state(
                conn,
                &node.id,
                gpu.index as i64,
                gpu.mig_enabled,
                &crate::hardware::mig_device_rows(&gpu),
            )
            .map_err(db_error)?;
        }
    }
    Ok(())
}
