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
use gpufleet_sql::AsConn;
use gpufleet_wire::protocol_version::{Version, NODE_LOCAL_VOLUMES};

use crate::error::{Error, Result};
use crate::registry::{Outcome, Registry};
use crate::state::AppState;
use crate::store;

/// What each of `node_ids` should have mounted: its cluster's volume, or nothing.
fn wanted(
    volumes: &crate::volumes::Volumes,
    conn: &impl AsConn,
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
    conn: &impl AsConn,
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

/// The refusal of node-local volumes on `nodes` (id, hostname) whose agent speaks a
/// protocol from before them: such an agent ignores the volume's size and owner and
/// refuses it as not under shared storage, so no order is sent. None when every agent can
/// (a node unheard of since start is checked when it registers: its volumes are synced
/// then).
pub fn unsupported<'a>(
    agents: &Registry,
    nodes: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Option<String> {
    let old: Vec<String> = nodes
        .into_iter()
        .filter_map(|(id, host)| {
            let v = agents.version_of(id)?;
            (v.protocol < NODE_LOCAL_VOLUMES).then(|| format!("node {host}'s agent is {v}"))
        })
        .collect();
    if old.is_empty() {
        return None;
    }
    Some(format!(
        "storage_path: node-local volumes (serve without --shared-storage) need node agents of protocol {NODE_LOCAL_VOLUMES} or later; {}, and this control plane is {}: upgrade the node agent, or run serve with --shared-storage",
        old.join("; "),
        Version::ours()
    ))
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
    // Nodes whose agent cannot make their node-local volume get no order (the others
    // still get theirs: a leaving node is unmounted all the same).
    let cannot = |o: &v1::SetVolumes, id: &str| {
        o.volumes.iter().any(|v| v.local_size_gib > 0)
            && state
                .agents
                .version_of(id)
                .is_some_and(|v| v.protocol < NODE_LOCAL_VOLUMES)
    };
    let (refused, plan): (Vec<_>, Vec<_>) = plan.into_iter().partition(|(id, _, o)| cannot(o, id));
    let refused = unsupported(
        &state.agents,
        refused
            .iter()
            .map(|(id, host, _)| (id.as_str(), host.as_str())),
    );
    let waits: Vec<_> = plan
        .into_iter()
        .map(|(id, host, order)| {
            let wait = state.agents.dispatch(
                &id,
                v1::WorkOrder {
                    id: uuid::Uuid::new_v4().to_string(),
                    epoch: 0, // stamped by Registry::dispatch
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
    if let Some(why) = refused {
        failed.insert(0, why);
        return Err(Error::Precondition(failed.join("; ")));
    }
    match failed.is_empty() {
        true => Ok(()),
        false => Err(Error::Aborted(format!(
            "storage_path: the cluster's volume could not be brought to its nodes: {}",
            failed.join("; ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_node_local_volume_is_refused_on_a_protocol_1_agent_naming_both_versions() {
        let agents = Registry::new(Duration::from_secs(10), Duration::from_secs(60));
        let (old, _old_rx) = tokio::sync::mpsc::unbounded_channel();
        let (new, _new_rx) = tokio::sync::mpsc::unbounded_channel();
        agents.attach("n-old", old, Version::peer("", None));
        agents.attach("n-new", new, Version::ours());
        // This release's agent, and a node unheard of since start, are not refused.
        assert_eq!(
            unsupported(&agents, [("n-new", "new"), ("n-gone", "gone")]),
            None
        );
        let why = unsupported(&agents, [("n-new", "new"), ("n-old", "old")]).unwrap();
        assert!(
            why.contains("node old's agent is an unnamed release speaking protocol 1")
                && !why.contains("node new")
                && why.contains(&format!("this control plane is {}", Version::ours()))
                && why.ends_with("upgrade the node agent, or run serve with --shared-storage"),
            "{why}"
        );
        // What it last said is kept while it is away, and dropped when the node is.
        agents.forget("n-old");
        assert_eq!(agents.version_of("n-old"), None);
    }
}
