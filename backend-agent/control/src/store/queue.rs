//! Creates waiting for capacity (issue 42): one row per cluster in status "queued", saying
//! since when it waits and until when. The row goes with its cluster (`ON DELETE
//! CASCADE`), so a queued cluster deleted by any path leaves nothing behind. The same
//! statements run on SQLite and PostgreSQL (`gpufleet_sql`).

use gpufleet_sql::{params, AsConn};

/// A queued cluster's wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedRow {
    pub cluster_id: String,
    /// When the create was queued (Unix seconds, the control plane's clock).
    pub queued_at: i64,
    /// When its wait runs out: not admitted by then, it is deleted.
    pub wait_until: i64,
}

pub fn insert(conn: &impl AsConn, row: &QueuedRow) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "INSERT INTO cluster_queue (cluster_id, queued_at, wait_until) VALUES (?1, ?2, ?3)",
        params![row.cluster_id, row.queued_at, row.wait_until],
    )?;
    Ok(())
}

/// Every queued cluster's wait in the order they wait: oldest first, and of those queued
/// in the same second the one created first (`clusters.created_seq`), so that "waiting
/// longest" is exact and one order on every replica and either engine.
pub fn list(conn: &impl AsConn) -> gpufleet_sql::Result<Vec<QueuedRow>> {
    conn.as_conn().query_map(
        "SELECT q.cluster_id, q.queued_at, q.wait_until
         FROM cluster_queue q JOIN clusters c ON c.id = q.cluster_id
         ORDER BY q.queued_at, c.created_seq, q.cluster_id",
        params![],
        |r| {
            Ok(QueuedRow {
                cluster_id: r.get(0)?,
                queued_at: r.get(1)?,
                wait_until: r.get(2)?,
            })
        },
    )
}

/// The wait of `cluster_id`, if it is queued.
pub fn get(conn: &impl AsConn, cluster_id: &str) -> gpufleet_sql::Result<Option<QueuedRow>> {
    conn.as_conn().query_opt(
        "SELECT queued_at, wait_until FROM cluster_queue WHERE cluster_id = ?1",
        params![cluster_id],
        |r| {
            Ok(QueuedRow {
                cluster_id: cluster_id.to_string(),
                queued_at: r.get(0)?,
                wait_until: r.get(1)?,
            })
        },
    )
}

/// The cluster no longer waits (admitted).
pub fn remove(conn: &impl AsConn, cluster_id: &str) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "DELETE FROM cluster_queue WHERE cluster_id = ?1",
        params![cluster_id],
    )?;
    Ok(())
}

/// How many clusters wait: `tenant_id`'s, or the whole fleet's.
pub fn count(conn: &impl AsConn, tenant_id: Option<&str>) -> gpufleet_sql::Result<i64> {
    // CAST: PostgreSQL cannot tell the type of a parameter that is only tested for NULL.
    conn.as_conn().query_row(
        "SELECT COUNT(*) FROM cluster_queue q JOIN clusters c ON c.id = q.cluster_id
         WHERE CAST(?1 AS TEXT) IS NULL OR c.tenant_id = ?1",
        params![tenant_id],
        |r| r.get(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::engines::on_both;

    fn wait(cluster_id: &str, queued_at: i64) -> QueuedRow {
        QueuedRow {
            cluster_id: cluster_id.into(),
            queued_at,
            wait_until: queued_at + 60,
        }
    }

    fn ids(rows: Vec<QueuedRow>) -> Vec<String> {
        rows.into_iter().map(|r| r.cluster_id).collect()
    }

    #[test]
    fn queued_clusters_wait_oldest_first_then_first_created_and_go_with_their_cluster() {
        on_both(|db| {
            // Waits queued in the same second go in the order their clusters were
            // created (b before C), whatever their ids, on both engines.
            let c = db.conn();
            c.execute_batch(
                "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
                 VALUES ('t1', 'a', 'A', '{}', 'h1', 0), ('t2', 'b', 'B', '{}', 'h2', 0);
                 INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count,
                     storage_gib, status, endpoint, credentials, storage_path, mig_layout)
                 VALUES ('b', 't1', 'b', 'slurm', 'H100', 1, 1, 'queued', '', '', '', ''),
                        ('C', 't1', 'c', 'slurm', 'H100', 1, 1, 'queued', '', '', '', ''),
                        ('a', 't2', 'a', 'slurm', 'H100', 1, 1, 'queued', '', '', '', ''),
                        ('d', 't2', 'd', 'slurm', 'H100', 1, 1, 'queued', '', '', '', '');",
            )
            .unwrap();
            insert(&c, &wait("b", 10)).unwrap();
            insert(&c, &wait("C", 10)).unwrap();
            insert(&c, &wait("a", 20)).unwrap();
            insert(&c, &wait("d", 5)).unwrap();
            // A wait that ends before it starts is refused by the schema on both.
            let mut bad = wait("d", 5);
            bad.wait_until = 5;
            assert!(insert(&c, &bad).is_err());

            assert_eq!(ids(list(&c).unwrap()), ["d", "b", "C", "a"]);
            assert_eq!(get(&c, "a").unwrap(), Some(wait("a", 20)));
            assert_eq!(get(&c, "z").unwrap(), None);
            assert_eq!(count(&c, None).unwrap(), 4);
            assert_eq!(count(&c, Some("t1")).unwrap(), 2);
            assert_eq!(count(&c, Some("t9")).unwrap(), 0);

            remove(&c, "d").unwrap();
            assert_eq!(get(&c, "d").unwrap(), None);
            // A deleted cluster's wait goes with it.
            c.execute("DELETE FROM clusters WHERE id = 'a'", params![])
                .unwrap();
            assert_eq!(ids(list(&c).unwrap()), ["b", "C"]);
            assert_eq!(count(&c, Some("t2")).unwrap(), 0);
        });
    }
}
