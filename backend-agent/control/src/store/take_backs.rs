//! Take-backs for reservation windows that the preemption loop decided and has not yet
//! recorded: one row per victim cluster, naming the epoch of the singletons' lease that
//! decided it and the on-demand replacements it assigned (`scheduling::take_back`).
//!
//! The row is written with the decision and deleted with its record, each in the fenced
//! transaction that does them. A row left by an older epoch is a take-back whose leader
//! lost the lease in between: the current leader settles it. Without a row, a cluster
//! that is `updating` is a request's change, which no leader touches.

use gpufleet_sql::{params, AsConn, Error};

/// A take-back decided and not recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingTakeBack {
    pub cluster_id: String,
    /// The epoch of the singletons' lease under which it was decided.
    pub epoch: i64,
    /// The ids of the on-demand nodes the decision assigned to the cluster.
    pub replacements: Vec<String>,
    pub decided_at: i64,
}

/// Marks `cluster_id`'s take-back as decided under `epoch` at `t`, with the
/// `replacements` (node ids) it assigned.
pub fn mark(
    conn: &impl AsConn,
    cluster_id: &str,
    epoch: i64,
    replacements: &[String],
    t: i64,
) -> gpufleet_sql::Result<()> {
    let ids = serde_json::to_string(replacements).map_err(|e| Error::Parameter(e.to_string()))?;
    conn.as_conn().execute(
        "INSERT INTO pending_take_backs (cluster_id, epoch, replacements, decided_at)
         VALUES (?1, ?2, ?3, ?4)",
        params![cluster_id, epoch, ids, t],
    )?;
    Ok(())
}

/// Deletes the mark of `cluster_id`'s take-back decided under `epoch`; whether there was
/// one (none: a later leader settled it, or a restart did).
pub fn clear(conn: &impl AsConn, cluster_id: &str, epoch: i64) -> gpufleet_sql::Result<bool> {
    let deleted = conn.as_conn().execute(
        "DELETE FROM pending_take_backs WHERE cluster_id = ?1 AND epoch = ?2",
        params![cluster_id, epoch],
    )?;
    Ok(deleted > 0)
}

/// Deletes every mark: a restart has just settled every `updating` cluster its own way
/// (`scheduling::clusters::recover_interrupted`), so none of them is a take-back's any
/// more.
pub fn clear_all(conn: &impl AsConn) -> gpufleet_sql::Result<usize> {
    conn.as_conn()
        .execute("DELETE FROM pending_take_backs", params![])
}

/// The take-backs decided under an epoch older than `epoch`, oldest first.
pub fn decided_before(
    conn: &impl AsConn,
    epoch: i64,
) -> gpufleet_sql::Result<Vec<PendingTakeBack>> {
    conn.as_conn().query_map(
        "SELECT cluster_id, epoch, replacements, decided_at FROM pending_take_backs
         WHERE epoch < ?1 ORDER BY decided_at, cluster_id",
        params![epoch],
        |r| {
            let ids: String = r.get(2)?;
            let replacements = serde_json::from_str(&ids).map_err(|e| Error::Column {
                index: 2,
                reason: e.to_string(),
            })?;
            Ok(PendingTakeBack {
                cluster_id: r.get(0)?,
                epoch: r.get(1)?,
                replacements,
                decided_at: r.get(3)?,
            })
        },
    )
}

/// Whether any take-back decided under an epoch older than `epoch` is left: the
/// preemption loop's cheap look before it settles them.
pub fn any_before(conn: &impl AsConn, epoch: i64) -> gpufleet_sql::Result<bool> {
    let found = conn.as_conn().query_opt(
        "SELECT 1 FROM pending_take_backs WHERE epoch < ?1 LIMIT 1",
        params![epoch],
        |_| Ok(()),
    )?;
    Ok(found.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::engines::on_both;

    #[test]
    fn a_mark_is_found_only_below_a_newer_epoch_and_cleared_only_by_its_own() {
        on_both(|db| {
            let conn = db.conn();
            conn.execute_batch(
                "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
                     VALUES ('t', 'team-t', '', '{}', 'ht', 0);
                 INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count,
                                       storage_gib, status, endpoint, credentials, storage_path,
                                       mig_layout)
                     VALUES ('c1', 't', 'c1', 'slurm', 'H100-80GB', 1, 1, 'updating', '', '', '', '{}');",
            )
            .unwrap();
            mark(&conn, "c1", 7, &["n2".to_string()], 100).unwrap();
            assert!(!any_before(&conn, 7).unwrap());
            assert!(decided_before(&conn, 7).unwrap().is_empty());
            assert!(any_before(&conn, 8).unwrap());
            assert_eq!(
                decided_before(&conn, 8).unwrap(),
                vec![PendingTakeBack {
                    cluster_id: "c1".into(),
                    epoch: 7,
                    replacements: vec!["n2".into()],
                    decided_at: 100,
                }]
            );
            assert!(!clear(&conn, "c1", 8).unwrap(), "another epoch's record");
            assert!(clear(&conn, "c1", 7).unwrap());
            assert!(!clear(&conn, "c1", 7).unwrap());
            // A deleted cluster takes its mark with it.
            mark(&conn, "c1", 7, &[], 100).unwrap();
            conn.execute("DELETE FROM clusters WHERE id = 'c1'", params![])
                .unwrap();
            assert!(!any_before(&conn, 8).unwrap());
            // A restart clears them all.
            conn.execute_batch(
                "INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count,
                                       storage_gib, status, endpoint, credentials, storage_path,
                                       mig_layout)
                     VALUES ('c2', 't', 'c2', 'slurm', 'H100-80GB', 0, 1, 'updating', '', '', '', '{}');",
            )
            .unwrap();
            mark(&conn, "c2", 3, &["n2".to_string()], 100).unwrap();
            assert_eq!(clear_all(&conn).unwrap(), 1);
            assert!(!any_before(&conn, i64::MAX).unwrap());
        });
    }

    /// Marks come back oldest first, and a mark whose replacements are not a list of ids
    /// is an error naming its column, not an empty list.
    #[test]
    fn marks_come_oldest_first_and_a_bad_list_is_an_error() {
        on_both(|db| {
            let conn = db.conn();
            conn.execute_batch(
                "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
                     VALUES ('t', 'team-t', '', '{}', 'ht', 0);
                 INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count,
                                       storage_gib, status, endpoint, credentials, storage_path,
                                       mig_layout)
                     VALUES ('c1', 't', 'c1', 'slurm', 'H100-80GB', 1, 1, 'updating', '', '', '', '{}'),
                            ('c2', 't', 'c2', 'slurm', 'H100-80GB', 1, 1, 'updating', '', '', '', '{}'),
                            ('c3', 't', 'c3', 'slurm', 'H100-80GB', 1, 1, 'updating', '', '', '', '{}');",
            )
            .unwrap();
            mark(&conn, "c2", 5, &["n1".to_string(), "n2".to_string()], 200).unwrap();
            mark(&conn, "c1", 6, &[], 100).unwrap();
            mark(&conn, "c3", 9, &[], 50).unwrap();
            let found: Vec<(String, usize)> = decided_before(&conn, 9)
                .unwrap()
                .into_iter()
                .map(|p| (p.cluster_id, p.replacements.len()))
                .collect();
            assert_eq!(found, vec![("c1".to_string(), 0), ("c2".to_string(), 2)]);
            conn.execute(
                "UPDATE pending_take_backs SET replacements = 'not json' WHERE cluster_id = 'c1'",
                params![],
            )
            .unwrap();
            let e = decided_before(&conn, 9).unwrap_err();
            assert!(matches!(e, Error::Column { index: 2, .. }), "{e}");
        });
    }
}
