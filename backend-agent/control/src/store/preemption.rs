//! Which clusters are preemptible: their pool nodes go back to reservations whose window
//! starts, replaced by on-demand nodes when `allow_on_demand`. The same statements run on
//! SQLite and PostgreSQL (`gpufleet_sql`).

use gpufleet_sql::{params, AsConn};

/// Marks `cluster_id` preemptible.
pub fn insert(
    conn: &impl AsConn,
    cluster_id: &str,
    allow_on_demand: bool,
) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "INSERT INTO cluster_preemption (cluster_id, allow_on_demand) VALUES (?1, ?2)",
        params![cluster_id, allow_on_demand],
    )?;
    Ok(())
}

/// None: not preemptible; Some(allow_on_demand) otherwise.
pub fn get(conn: &impl AsConn, cluster_id: &str) -> gpufleet_sql::Result<Option<bool>> {
    conn.as_conn().query_opt(
        "SELECT allow_on_demand FROM cluster_preemption WHERE cluster_id = ?1",
        params![cluster_id],
        |r| r.get(0),
    )
}

/// Pool nodes of `gpu_type` that preemptible clusters hold.
pub fn pool_nodes(conn: &impl AsConn, gpu_type: &str) -> gpufleet_sql::Result<i64> {
    // From the (few) preemptible clusters to their nodes, never a scan of the model's nodes.
    // CROSS JOIN fixes that order on SQLite; its condition is in WHERE, as PostgreSQL
    // takes no ON after CROSS JOIN (and plans it as the inner join it is).
    conn.as_conn().query_row(
        "SELECT COUNT(*) FROM cluster_preemption p CROSS JOIN nodes n
         WHERE n.cluster_id = p.cluster_id AND n.gpu_type = ?1 AND n.capacity = 'pool'",
        params![gpu_type],
        |r| r.get(0),
    )
}

/// Preemptible clusters of `gpu_type` holding pool nodes, with their allow_on_demand;
/// the newest first (the last to come gives back first), by the order clusters were
/// created in (`created_seq`).
pub fn holding_pool(
    conn: &impl AsConn,
    gpu_type: &str,
) -> gpufleet_sql::Result<Vec<(String, bool)>> {
    conn.as_conn().query_map(
        "SELECT c.id, p.allow_on_demand FROM clusters c
         JOIN cluster_preemption p ON p.cluster_id = c.id
         WHERE c.gpu_type = ?1 AND EXISTS
             (SELECT 1 FROM nodes n WHERE n.cluster_id = c.id AND n.capacity = 'pool')
         ORDER BY c.created_seq DESC",
        params![gpu_type],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

/// Models some preemptible cluster holds pool nodes of, by their bytes, as SQLite's
/// ORDER BY gives them (PostgreSQL's follows the database's collation).
pub fn models(conn: &impl AsConn) -> gpufleet_sql::Result<Vec<String>> {
    let mut models: Vec<String> = conn.as_conn().query_map(
        "SELECT DISTINCT n.gpu_type FROM nodes n
         JOIN cluster_preemption p ON p.cluster_id = n.cluster_id
         WHERE n.capacity = 'pool' ORDER BY n.gpu_type",
        params![],
        |r| r.get(0),
    )?;
    models.sort();
    Ok(models)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::engines::on_both;

    /// Tenant t1; clusters c1 (H100, preemptible, on-demand allowed: two pool nodes and an
    /// on-demand one), c2 (H100, preemptible: on-demand only), c3 (h100, preemptible: one
    /// pool node), c4 (H100, not preemptible: a pool node), inserted in that order.
    fn fixtures(c: &gpufleet_sql::Conn<'_>) {
        c.execute_batch(
            "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
             VALUES ('t1', 'a', 'A', '{}', 'h1', 0);
             INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count,
                 storage_gib, status, endpoint, credentials, storage_path, mig_layout)
             VALUES ('c1', 't1', 'c1', 'slurm', 'H100', 3, 1, 'running', '', '', '', ''),
                    ('c2', 't1', 'c2', 'slurm', 'H100', 1, 1, 'running', '', '', '', ''),
                    ('c3', 't1', 'c3', 'slurm', 'h100', 1, 1, 'running', '', '', '', ''),
                    ('c4', 't1', 'c4', 'slurm', 'H100', 1, 1, 'running', '', '', '', '');
             INSERT INTO nodes (id, hostname, gpu_type, capacity, gpu_count, driver_version,
                 cuda_version, cluster_id, state)
             VALUES ('n1', 'n1', 'H100', 'pool', 8, '', '', 'c1', 'busy'),
                    ('n2', 'n2', 'H100', 'pool', 8, '', '', 'c1', 'busy'),
                    ('n3', 'n3', 'H100', 'on-demand', 8, '', '', 'c1', 'busy'),
                    ('n4', 'n4', 'H100', 'on-demand', 8, '', '', 'c2', 'busy'),
                    ('n5', 'n5', 'h100', 'pool', 8, '', '', 'c3', 'busy'),
                    ('n6', 'n6', 'H100', 'pool', 8, '', '', 'c4', 'busy'),
                    ('n7', 'n7', 'H100', 'pool', 8, '', '', NULL, 'ready');",
        )
        .unwrap();
        insert(c, "c1", true).unwrap();
        insert(c, "c2", false).unwrap();
        insert(c, "c3", false).unwrap();
    }

    #[test]
    fn preemptible_clusters_and_the_pool_nodes_they_hold() {
        on_both(|db| {
            // (models' bytewise sort is not tried under another collation here: the
            // counters' triggers keep nodes.gpu_type's from being altered.)
            let c = db.conn();
            fixtures(&c);
            assert_eq!(get(&c, "c1").unwrap(), Some(true));
            assert_eq!(get(&c, "c2").unwrap(), Some(false));
            assert_eq!(get(&c, "c4").unwrap(), None);
            // Marked once.
            assert!(insert(&c, "c1", false).is_err());
            assert_eq!(pool_nodes(&c, "H100").unwrap(), 2);
            assert_eq!(pool_nodes(&c, "h100").unwrap(), 1);
            assert_eq!(pool_nodes(&c, "A100").unwrap(), 0);
            assert_eq!(models(&c).unwrap(), ["H100", "h100"]);
            // The mark goes with its cluster.
            c.execute_batch(
                "UPDATE nodes SET cluster_id = NULL WHERE cluster_id = 'c3';
                 DELETE FROM clusters WHERE id = 'c3';",
            )
            .unwrap();
            assert_eq!(get(&c, "c3").unwrap(), None);
            assert_eq!(models(&c).unwrap(), ["H100"]);
        });
    }

    #[test]
    fn the_newest_preemptible_cluster_gives_back_first() {
        on_both(|db| {
            let c = db.conn();
            fixtures(&c);
            // Inserted last, though its id sorts first.
            c.execute_batch(
                "INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count,
                 storage_gib, status, endpoint, credentials, storage_path, mig_layout)
             VALUES ('a0', 't1', 'a0', 'slurm', 'H100', 1, 1, 'running', '', '', '', '');
             UPDATE nodes SET cluster_id = 'a0' WHERE id = 'n7';",
            )
            .unwrap();
            insert(&c, "a0", false).unwrap();
            // c2 holds no pool node, c3's are another model's, c4 is not preemptible.
            assert_eq!(
                holding_pool(&c, "H100").unwrap(),
                vec![("a0".to_string(), false), ("c1".to_string(), true)]
            );
            assert_eq!(
                holding_pool(&c, "h100").unwrap(),
                vec![("c3".to_string(), false)]
            );
        });
    }

    /// SQLite's own: it inspects SQLite's schema text and file.
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
