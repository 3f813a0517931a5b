//! Team volumes on the nodes of their clusters: with external node agents, every node of
//! a cluster has the cluster's volume mounted at its `storage_path`
//! (`/run/gpufleet/volumes/<tenant id>/<cluster name>`, the same on every node): with
//! shared storage bind-mounted from it, without it a node-local volume of `storage_gib`
//! each node makes (`SetVolumes` names the size and the owner), and a node that is in no
//! cluster has none. [`sync`] orders each named node to
//! exactly that (`SetVolumes`, declarative), from what the store says now; it runs after
//! every change of who is in a cluster: a create's nodes once their layout converged, an
//! update's joining and leaving nodes, a delete's nodes, a replacement, and every node
//! brought back to its recorded state (`mig::mark_reconciled`: a node that rejoins, or is
//! freed while it was away). An unreachable node is not waited for: it gets its volumes
//! when it rejoins.
//!
//! Embedded nodes are the control plane's host, which mounts the shared storage itself:
//! their volumes are used in place and no order is sent (`Volumes::mounts_on_nodes`).

use gpufleet_proto::v1;

use crate::error::{Error, Result};
use crate::registry::Outcome;
use crate::state::AppState;
use crate::store;

/// What each of `node_ids` should have mounted: its cluster's volume, or nothing.
fn wanted(
    volumes: &crate::volumes::Volumes,
    conn: &rusqlite::Connection,
    node_ids: &[String],
) -> Result<Vec<(String, String, v1::SetVolumes)>> {
    let mut out = Vec::new();
    for id in node_ids {
        let Some(node) = store::nodes::get(conn, id)? else {
            continue;
        };
        let cluster = match &node.cluster_id {
            Some(c) => store::clusters::get(conn, c)?,
            None => None,
        };
        let volumes = match cluster {
            Some(c) => mount_of(volumes, conn, c)?.into_iter().collect(),
            None => Vec::new(),
        };
        out.push((node.id, node.hostname, v1::SetVolumes { volumes }));
    }
    Ok(out)
}

/// How a node of cluster `c` mounts its volume: from the shared storage, or its own of
/// the cluster's size and account. None for a cluster whose volume is not on its nodes
/// (made before node-local volumes, in the control plane's data dir).
fn mount_of(
    volumes: &crate::volumes::Volumes,
    conn: &rusqlite::Connection,
    c: store::clusters::ClusterRow,
) -> Result<Option<v1::VolumeMount>> {
    if !volumes.is_node_local() {
        return Ok(Some(v1::VolumeMount {
            source: volumes.path(&c.tenant_id, &c.name).display().to_string(),
            target: c.storage_path,
            ..Default::default()
        }));
    }
    if !c
        .storage_path
        .starts_with(gpufleet_wire::volumes::VOLUME_MOUNTS)
    {
        return Ok(None);
    }
    let owner = store::slurm_access::get(conn, &c.id)?.map_or(0, |a| a.uid);
    Ok(Some(v1::VolumeMount {
        source: String::new(),
        target: c.storage_path,
        local_size_gib: c.storage_gib,
        owner_uid: owner,
    }))
}

/// Brings the volume mounts of `node_ids` to their clusters' (none for a free node).
/// Fails naming the node and its agent's error when an agent cannot; unreachable nodes
/// are skipped (logged).
pub async fn sync(state: &AppState, node_ids: Vec<String>) -> Result<()> {
    if !state.volumes.mounts_on_nodes() || node_ids.is_empty() {
        return Ok(());
    }
    let volumes = state.volumes.clone();
    let plan = state
        .read(move |conn| wanted(&volumes, conn, &node_ids))
        .await?;
    let waits: Vec<_> = plan
        .into_iter()
        .map(|(id, host, order)| {
            let wait = state.agents.dispatch(
                &id,
                v1::WorkOrder {
                    id: uuid::Uuid::new_v4().to_string(),
                    kind: Some(v1::work_order::Kind::SetVolumes(order)),
                },
            );
            (host, wait)
        })
        .collect();
    let mut failed = Vec::new();
    for (host, wait) in waits {
        match wait.await {
            Ok(Outcome::Answered(r)) if r.ok => {}
            Ok(Outcome::Answered(r)) => failed.push(format!("{host}: {}", r.error)),
            Ok(Outcome::Unreachable(why)) => {
                tracing::warn!(node = %host, %why, "volumes not brought to an unreachable node; it gets them when it rejoins")
            }
            Err(_) => failed.push(format!("{host}: the control plane is stopping")),
        }
    }
    match failed.is_empty() {
        true => Ok(()),
        false => Err(Error::Aborted(format!(
            "storage_path: the cluster's volume could not be brought to its nodes: {}",
            failed.join("; ")
        ))),
    }
}
