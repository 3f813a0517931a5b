//! The event log: what happened to an object (a cluster, a node, a breaker), oldest
//! first, readable by the tenant that owns it; and the stream of all of them.

use rusqlite::Connection;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    /// The fleet-wide sequence (the admin's cursor).
    pub seq: i64,
    /// The tenant's own sequence (its cursor); None for the fleet's own events.
    pub tenant_seq: Option<i64>,
    pub at: i64,
    pub object_id: String,
    pub tenant_id: String,
    pub kind: String,
    pub node: String,
    pub message: String,
}

/// Events kept per object; older ones are dropped as new ones come.
pub const KEEP_PER_OBJECT: i64 = 1000;

pub fn record(
    conn: &Connection,
    at: i64,
    object_id: &str,
    tenant_id: &str,
    kind: &str,
    node: &str,
    message: &str,
) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "INSERT INTO events (at, object_id, tenant_id, kind, node, message, tenant_seq)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, CASE WHEN ?3 = '' THEN NULL ELSE
                   (SELECT IFNULL(MAX(tenant_seq), 0) + 1 FROM events WHERE tenant_id = ?3) END)",
        rusqlite::params![at, object_id, tenant_id, kind, node, message],
    )?;
    super::exec(
        conn,
        "DELETE FROM events WHERE object_id = ?1 AND seq <= (SELECT MAX(seq) FROM events WHERE object_id = ?1) - ?2",
        rusqlite::params![object_id, KEEP_PER_OBJECT],
    )?;
    Ok(())
}

fn from_row(r: &rusqlite::Row) -> rusqlite::Result<EventRow> {
    Ok(EventRow {
        seq: r.get(0)?,
        at: r.get(1)?,
        object_id: r.get(2)?,
        tenant_id: r.get(3)?,
        kind: r.get(4)?,
        node: r.get(5)?,
        message: r.get(6)?,
        tenant_seq: r.get(7)?,
    })
}

pub fn list(conn: &Connection, object_id: &str) -> rusqlite::Result<Vec<EventRow>> {
    let mut stmt = conn.prepare(
        "SELECT seq, at, object_id, tenant_id, kind, node, message, tenant_seq FROM events WHERE object_id = ?1 ORDER BY seq",
    )?;
    let rows = stmt.query_map([object_id], from_row)?;
    rows.collect()
}

/// The latest event of `object_id` that concerns `node`, if any.
pub fn last_of_node(
    conn: &Connection,
    object_id: &str,
    node: &str,
) -> rusqlite::Result<Option<EventRow>> {
    use rusqlite::OptionalExtension;
    conn.prepare_cached(
        "SELECT seq, at, object_id, tenant_id, kind, node, message, tenant_seq FROM events
         WHERE object_id = ?1 AND node = ?2 ORDER BY seq DESC LIMIT 1",
    )?
    .query_row([object_id, node], from_row)
    .optional()
}

/// The stream of events after `after`, oldest first, at most `limit`: every object's
/// (`after` a fleet-wide seq), or only `tenant`'s (`after` that tenant's own seq).
pub fn stream(
    conn: &Connection,
    tenant: Option<&str>,
    after: i64,
    limit: i64,
) -> rusqlite::Result<Vec<EventRow>> {
    let sql = match tenant {
        None => {
            "SELECT seq, at, object_id, tenant_id, kind, node, message, tenant_seq FROM events
                 WHERE seq > ?1 AND ?2 IS NULL ORDER BY seq LIMIT ?3"
        }
        Some(_) => {
            "SELECT seq, at, object_id, tenant_id, kind, node, message, tenant_seq FROM events
                    WHERE tenant_id = ?2 AND tenant_seq > ?1 ORDER BY tenant_seq LIMIT ?3"
        }
    };
    let after_seq = after;
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map(rusqlite::params![after_seq, tenant, limit], from_row)?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn events_come_back_in_order_per_object() {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("s.db")).unwrap();
        super::record(&conn, 1, "c1", "t1", "node_draining", "n1", "a").unwrap();
        super::record(&conn, 2, "c2", "t1", "node_draining", "n2", "b").unwrap();
        super::record(&conn, 3, "c1", "t1", "node_returned", "n1", "c").unwrap();
        let kinds: Vec<String> = super::list(&conn, "c1")
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds, vec!["node_draining", "node_returned"]);
        // Another tenant's events leave no gap in this one's own sequence.
        super::record(&conn, 4, "c9", "t2", "node_draining", "n9", "d").unwrap();
        super::record(&conn, 5, "c1", "t1", "node_draining", "n1", "e").unwrap();
        let own: Vec<_> = super::stream(&conn, Some("t1"), 0, 10)
            .unwrap()
            .into_iter()
            .map(|e| e.tenant_seq.unwrap())
            .collect();
        assert_eq!(own, vec![1, 2, 3, 4]);
        assert_eq!(
            super::stream(&conn, Some("t2"), 0, 10).unwrap()[0].tenant_seq,
            Some(1)
        );
        assert_eq!(super::stream(&conn, None, 3, 10).unwrap().len(), 2);
    }
}
