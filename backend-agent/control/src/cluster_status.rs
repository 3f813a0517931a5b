//! A tenant cluster's status around changes: the statuses that mean a request is
//! changing it, the status once a change is through (degraded while a node is
//! unreachable), and a degraded cluster's return to running.

use gpufleet_sql::AsConn;

use crate::error::{Error, Result};
use crate::store::{self, clusters::ClusterRow, nodes::NODE_UNREACHABLE};

/// Statuses in which a request is already changing the cluster.
pub const CHANGING: [&str; 3] = ["creating", "updating", "deleting"];

pub fn refuse_while_changing(c: &ClusterRow) -> Result<()> {
    if CHANGING.contains(&c.status.as_str()) {
        return Err(Error::Precondition(format!(
            "tenant cluster {} is {} by another request; retry when its status is running",
            c.name,
            match c.status.as_str() {
                "creating" => "being created",
                "updating" => "being updated",
                _ => "being deleted",
            }
        )));
    }
    Ok(())
}

/// Its status once a change is through: degraded while a node is unreachable, saying
/// since when, why, and from when it is replaced (`replace_after` later).
pub fn settled_status(
    conn: &impl AsConn,
    cluster_id: &str,
    replace_after: std::time::Duration,
) -> Result<(String, String)> {
    let after = i64::try_from(replace_after.as_secs()).unwrap_or(i64::MAX);
    let down: Vec<String> = store::nodes::list(conn, None, Some(cluster_id))?
        .into_iter()
        .filter(|n| n.state == NODE_UNREACHABLE)
        .map(|n| {
            format!(
                "node {} unreachable since {}{}; it is replaced from {} when capacity and quota allow",
                n.hostname,
                crate::state::rfc3339(n.state_since),
                if n.state_reason.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", n.state_reason)
                },
                crate::state::rfc3339(n.state_since.saturating_add(after)),
            )
        })
        .collect();
    Ok(if down.is_empty() {
        ("running".into(), String::new())
    } else {
        ("degraded".into(), down.join("; "))
    })
}

/// A degraded cluster whose nodes are all reachable again is running again.
pub fn refresh_cluster(conn: &impl AsConn, cluster_id: &str) -> gpufleet_sql::Result<()> {
    let Some(c) = store::clusters::get(conn, cluster_id)? else {
        return Ok(());
    };
    if c.status != "degraded" {
        return Ok(());
    }
    let nodes = store::nodes::list(conn, None, Some(cluster_id))?;
    if nodes.iter().all(|n| n.state != NODE_UNREACHABLE) {
        store::clusters::set_status(conn, cluster_id, "running", "")?;
        tracing::info!(cluster = %c.name, "every node of the cluster is reachable again");
    }
    Ok(())
}
