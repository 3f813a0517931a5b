//! Creates waiting for capacity (issue 42): one row per cluster in status "queued", saying
//! since when it waits and until when. The row goes with its cluster (`ON DELETE
//! CASCADE`), so a queued cluster deleted by any path leaves nothing behind.

use rusqlite::Connection;

/// A queued cluster's wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedRow {
    pub cluster_id: String,
    /// When the create was queued (Unix seconds, the control plane's clock).
    pub queued_at: i64,
    /// When its wait runs out: not admitted by then, it is deleted.
    pub wait_until: i64,
}

pub fn insert(conn: &Connection, row: &QueuedRow) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "INSERT INTO cluster_queue (cluster_id, queued_at, wait_until) VALUES (?1, ?2, ?3)",
        rusqlite::params![row.cluster_id, row.queued_at, row.wait_until],
    )?;
    Ok(())
}

/// Every queued cluster's wait, oldest first (ties by id: one order on every replica).
pub fn list(conn: &Connection) -> rusqlite::Result<Vec<QueuedRow>> {
    let mut stmt = conn.prepare_cached(
        "SELECT cluster_id, queued_at, wait_until FROM cluster_queue
         ORDER BY queued_at, cluster_id",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(QueuedRow {
            cluster_id: r.get(0)?,
            queued_at: r.get(1)?,
            wait_until: r.get(2)?,
        })
    })?;
    rows.collect()
}

/// The wait of `cluster_id`, if it is queued.
pub fn get(conn: &Connection, cluster_id: &str) -> rusqlite::Result<Option<QueuedRow>> {
    use rusqlite::OptionalExtension;
    conn.prepare_cached("SELECT queued_at, wait_until FROM cluster_queue WHERE cluster_id = ?1")?
        .query_row([cluster_id], |r| {
            Ok(QueuedRow {
                cluster_id: cluster_id.to_string(),
                queued_at: r.get(0)?,
                wait_until: r.get(1)?,
            })
        })
        .optional()
}

/// The cluster no longer waits (admitted).
pub fn remove(conn: &Connection, cluster_id: &str) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "DELETE FROM cluster_queue WHERE cluster_id = ?1",
        [cluster_id],
    )?;
    Ok(())
}

/// How many clusters wait: `tenant_id`'s, or the whole fleet's.
pub fn count(conn: &Connection, tenant_id: Option<&str>) -> rusqlite::Result<i64> {
    conn.prepare_cached(
        "SELECT COUNT(*) FROM cluster_queue q JOIN clusters c ON c.id = q.cluster_id
         WHERE ?1 IS NULL OR c.tenant_id = ?1",
    )?
    .query_row([tenant_id], |r| r.get(0))
}
