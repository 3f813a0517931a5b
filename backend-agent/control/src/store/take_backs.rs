//! Take-backs for reservation windows that the preemption loop decided and has not yet
//! recorded: one row per victim cluster, naming the epoch of the singletons' lease that
//! decided it and the on-demand replacements it assigned (`scheduling::take_back`).
//!
//! The row is written with the decision and deleted with its record, each in the fenced
//! transaction that does them. A row left by an older epoch is a take-back whose leader
//! lost the lease in between: the current leader settles it. Without a row, a cluster
//! that is `updating` is a request's change, which no leader touches.

use rusqlite::{Connection, OptionalExtension};

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
    conn: &Connection,
    cluster_id: &str,
    epoch: i64,
    replacements: &[String],
    t: i64,
) -> rusqlite::Result<()> {
    let ids = serde_json::to_string(replacements)
        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
    super::exec(
        conn,
        "INSERT INTO pending_take_backs (cluster_id, epoch, replacements, decided_at)
         VALUES (?1, ?2, ?3, ?4)",
        rusqlite::params![cluster_id, epoch, ids, t],
    )?;
    Ok(())
}

/// Deletes the mark of `cluster_id`'s take-back decided under `epoch`; whether there was
/// one (none: a later leader settled it, or a restart did).
pub fn clear(conn: &Connection, cluster_id: &str, epoch: i64) -> rusqlite::Result<bool> {
    let deleted = super::exec(
        conn,
        "DELETE FROM pending_take_backs WHERE cluster_id = ?1 AND epoch = ?2",
        rusqlite::params![cluster_id, epoch],
    )?;
    Ok(deleted > 0)
}

/// Deletes every mark: a restart has just settled every `updating` cluster its own way
/// (`scheduling::clusters::recover_interrupted`), so none of them is a take-back's any
/// more.
pub fn clear_all(conn: &Connection) -> rusqlite::Result<usize> {
    super::exec(conn, "DELETE FROM pending_take_backs", [])
}

/// The take-backs decided under an epoch older than `epoch`, oldest first.
pub fn decided_before(conn: &Connection, epoch: i64) -> rusqlite::Result<Vec<PendingTakeBack>> {
    let mut stmt = conn.prepare_cached(
        "SELECT cluster_id, epoch, replacements, decided_at FROM pending_take_backs
         WHERE epoch < ?1 ORDER BY decided_at, cluster_id",
    )?;
    let rows = stmt.query_map([epoch], |r| {
        let ids: String = r.get(2)?;
        let replacements = serde_json::from_str(&ids).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(2, rusqlite::types::Type::Text, Box::new(e))
        })?;
        Ok(PendingTakeBack {
            cluster_id: r.get(0)?,
            epoch: r.get(1)?,
            replacements,
            decided_at: r.get(3)?,
        })
    })?;
    rows.collect()
}

/// Whether any take-back decided under an epoch older than `epoch` is left: the
/// preemption loop's cheap look before it settles them.
pub fn any_before(conn: &Connection, epoch: i64) -> rusqlite::Result<bool> {
    conn.prepare_cached("SELECT 1 FROM pending_take_backs WHERE epoch < ?1 LIMIT 1")?
        .query_row([epoch], |_| Ok(()))
        .optional()
        .map(|found| found.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_is_found_only_below_a_newer_epoch_and_cleared_only_by_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let conn = super::super::open(&dir.path().join("state.db")).unwrap();
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
        conn.execute("DELETE FROM clusters WHERE id = 'c1'", [])
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
    }
}
