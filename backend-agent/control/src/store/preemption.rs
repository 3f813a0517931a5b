//! Which clusters are preemptible: their pool nodes go back to reservations whose window
//! starts, replaced by on-demand nodes when `allow_on_demand`.

use rusqlite::{Connection, OptionalExtension};

/// Marks `cluster_id` preemptible.
pub fn insert(conn: &Connection, cluster_id: &str, allow_on_demand: bool) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO cluster_preemption (cluster_id, allow_on_demand) VALUES (?1, ?2)",
        (cluster_id, allow_on_demand),
    )?;
    Ok(())
}

/// None: not preemptible; Some(allow_on_demand) otherwise.
pub fn get(conn: &Connection, cluster_id: &str) -> rusqlite::Result<Option<bool>> {
    conn.query_row(
        "SELECT allow_on_demand FROM cluster_preemption WHERE cluster_id = ?1",
        [cluster_id],
        |r| r.get(0),
    )
    .optional()
}

/// Pool nodes of `gpu_type` that preemptible clusters hold.
pub fn pool_nodes(conn: &Connection, gpu_type: &str) -> rusqlite::Result<i64> {
    // From the (few) preemptible clusters to their nodes, never a scan of the model's nodes.
    conn.prepare_cached(
        "SELECT COUNT(*) FROM cluster_preemption p CROSS JOIN nodes n ON n.cluster_id = p.cluster_id
         WHERE n.gpu_type = ?1 AND n.capacity = 'pool'",
    )?
    .query_row([gpu_type], |r| r.get(0))
}

/// Preemptible clusters of `gpu_type` holding pool nodes, with their allow_on_demand;
/// the newest first (the last to come gives back first).
pub fn holding_pool(conn: &Connection, gpu_type: &str) -> rusqlite::Result<Vec<(String, bool)>> {
    let mut stmt = conn.prepare(
        "SELECT c.id, p.allow_on_demand FROM clusters c
         JOIN cluster_preemption p ON p.cluster_id = c.id
         WHERE c.gpu_type = ?1 AND EXISTS
             (SELECT 1 FROM nodes n WHERE n.cluster_id = c.id AND n.capacity = 'pool')
         ORDER BY c.rowid DESC",
    )?;
    let rows = stmt.query_map([gpu_type], |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

/// Models some preemptible cluster holds pool nodes of.
pub fn models(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare(
        "SELECT DISTINCT n.gpu_type FROM nodes n
         JOIN cluster_preemption p ON p.cluster_id = n.cluster_id
         WHERE n.capacity = 'pool' ORDER BY n.gpu_type",
    )?;
    let rows = stmt.query_map([], |r| r.get(0))?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cluster_may_have_no_nodes_and_the_schema_stays_sound() {
        let dir = tempfile::tempdir().unwrap();
        let conn = super::super::open(&dir.path().join("state.db")).unwrap();
        let sql: String = conn
            .query_row(
                "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'clusters'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(sql.contains("CHECK (node_count >= 0)"), "{sql}");
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
    }
}
