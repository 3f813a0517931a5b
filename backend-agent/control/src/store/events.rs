//! The event log: what happened to an object (a cluster, a node, a breaker), oldest
//! first, readable by the tenant that owns it; and the stream of all of them. The same
//! statements run on SQLite and PostgreSQL (`gpufleet_sql`) but for how a new event is
//! numbered (see [`record`]).

use gpufleet_sql::{params, AsConn, Engine, Row};

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

/// Records an event, numbered after every event before it: `seq` fleet-wide and, for a
/// tenant's event, `tenant_seq` in its tenant's own sequence (MAX + 1, gap-free), both in
/// commit order, since they are readers' cursors. Call it inside a write transaction
/// (`Database::write`, or SQLite's one writer): on PostgreSQL the transaction is
/// serializable, so of two that read the same MAX one fails and is run again.
///
/// tenant_seq is MAX + 1 on both engines (as SQLite's store always numbered it): a number
/// comes again only if the tenant's newest event is deleted, and nothing deletes it: the
/// pruning keeps each object's newest, an object's events are its one tenant's, and
/// `nodes::forget_candidate` deletes a free node's events, which are no tenant's.
pub fn record(
    conn: &impl AsConn,
    at: i64,
    object_id: &str,
    tenant_id: &str,
    kind: &str,
    node: &str,
    message: &str,
) -> gpufleet_sql::Result<()> {
    let c = conn.as_conn();
    let sql = match c.engine() {
        // AUTOINCREMENT numbers seq: in commit order (one writer), never a number used
        // before, even one whose event was deleted.
        Engine::Sqlite => {
            "INSERT INTO events (at, object_id, tenant_id, kind, node, message, tenant_seq)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, CASE WHEN ?3 = '' THEN NULL ELSE
                       (SELECT COALESCE(MAX(tenant_seq), 0) + 1 FROM events WHERE tenant_id = ?3) END)"
        }
        // An identity's numbers are not in commit order, so seq is numbered here: after
        // MAX(seq), which every event-writing transaction reads, so that serializable
        // transactions number in commit order (two that read the same MAX conflict). Not
        // MAX + 1 alone: a deleted newest event (nodes::forget_candidate deletes all of a
        // candidate's) would give its number again, and a stream's cursor already past it
        // would miss the new event; the identity's sequence never gives a number twice,
        // so the greater of the two is new. Its numbers of transactions run again are
        // gaps, as pruned events are: seq is ordered, not gap-free (tenant_seq is). Rows
        // copied in with their seq leave the sequence behind: MAX + 1 still orders them.
        Engine::Postgres => {
            "INSERT INTO events (seq, at, object_id, tenant_id, kind, node, message, tenant_seq)
             VALUES (GREATEST((SELECT COALESCE(MAX(seq), 0) + 1 FROM events),
                              nextval(pg_get_serial_sequence('events', 'seq'))),
                     ?1, ?2, ?3, ?4, ?5, ?6, CASE WHEN ?3 = '' THEN NULL ELSE
                       (SELECT COALESCE(MAX(tenant_seq), 0) + 1 FROM events WHERE tenant_id = ?3) END)"
        }
    };
    c.execute(sql, params![at, object_id, tenant_id, kind, node, message])?;
    c.execute(
        "DELETE FROM events WHERE object_id = ?1 AND seq <= (SELECT MAX(seq) FROM events WHERE object_id = ?1) - ?2",
        params![object_id, KEEP_PER_OBJECT],
    )?;
    Ok(())
}

fn from_row(r: &Row) -> gpufleet_sql::Result<EventRow> {
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

pub fn list(conn: &impl AsConn, object_id: &str) -> gpufleet_sql::Result<Vec<EventRow>> {
    conn.as_conn().query_map(
        "SELECT seq, at, object_id, tenant_id, kind, node, message, tenant_seq FROM events WHERE object_id = ?1 ORDER BY seq",
        params![object_id],
        from_row,
    )
}

/// The latest event of `object_id` that concerns `node`, if any.
pub fn last_of_node(
    conn: &impl AsConn,
    object_id: &str,
    node: &str,
) -> gpufleet_sql::Result<Option<EventRow>> {
    conn.as_conn().query_opt(
        "SELECT seq, at, object_id, tenant_id, kind, node, message, tenant_seq FROM events
         WHERE object_id = ?1 AND node = ?2 ORDER BY seq DESC LIMIT 1",
        params![object_id, node],
        from_row,
    )
}

/// The stream of events after `after`, oldest first, at most `limit`: every object's
/// (`after` a fleet-wide seq), or only `tenant`'s (`after` that tenant's own seq).
pub fn stream(
    conn: &impl AsConn,
    tenant: Option<&str>,
    after: i64,
    limit: i64,
) -> gpufleet_sql::Result<Vec<EventRow>> {
    let sql = match tenant {
        // The CAST: PostgreSQL cannot tell the type of a parameter alone in IS NULL.
        None => {
            "SELECT seq, at, object_id, tenant_id, kind, node, message, tenant_seq FROM events
                 WHERE seq > ?1 AND CAST(?2 AS TEXT) IS NULL ORDER BY seq LIMIT ?3"
        }
        Some(_) => {
            "SELECT seq, at, object_id, tenant_id, kind, node, message, tenant_seq FROM events
                    WHERE tenant_id = ?2 AND tenant_seq > ?1 ORDER BY tenant_seq LIMIT ?3"
        }
    };
    conn.as_conn()
        .query_map(sql, params![after, tenant, limit], from_row)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::engines::{self, on_both};
    use gpufleet_sql::Database;

    fn event(db: &mut Database, at: i64, object: &str, tenant: &str, kind: &str, node: &str) {
        db.write(|c| record(c, at, object, tenant, kind, node, "m"))
            .unwrap();
    }

    #[test]
    fn events_come_back_in_order_per_object() {
        on_both(|db| {
            event(db, 1, "c1", "t1", "node_draining", "n1");
            event(db, 2, "c2", "t1", "node_draining", "n2");
            event(db, 3, "c1", "t1", "node_returned", "n1");
            let kinds: Vec<String> = list(&db.conn(), "c1")
                .unwrap()
                .into_iter()
                .map(|e| e.kind)
                .collect();
            assert_eq!(kinds, vec!["node_draining", "node_returned"]);
            // Another tenant's events leave no gap in this one's own sequence.
            event(db, 4, "c9", "t2", "node_draining", "n9");
            event(db, 5, "c1", "t1", "node_draining", "n1");
            let c = db.conn();
            let own: Vec<_> = stream(&c, Some("t1"), 0, 10)
                .unwrap()
                .into_iter()
                .map(|e| e.tenant_seq.unwrap())
                .collect();
            assert_eq!(own, vec![1, 2, 3, 4]);
            assert_eq!(
                stream(&c, Some("t2"), 0, 10).unwrap()[0].tenant_seq,
                Some(1)
            );
            assert_eq!(stream(&c, None, 3, 10).unwrap().len(), 2);
            // The fleet's own events have no tenant sequence.
            event(db, 6, "n1", "", "node_joined", "n1");
            let c = db.conn();
            let last = stream(&c, None, 5, 10).unwrap();
            assert_eq!((last.len(), last[0].tenant_seq), (1, None));
            assert_eq!(last_of_node(&c, "c1", "n1").unwrap().unwrap().at, 5);
            assert_eq!(last_of_node(&c, "c1", "n7").unwrap(), None);
        });
    }

    #[test]
    fn an_object_keeps_its_newest_events_only() {
        on_both(|db| {
            db.write(|c| {
                for at in 0..KEEP_PER_OBJECT + 3 {
                    record(c, at, "busy", "t1", "k", "", "m")?;
                }
                record(c, 0, "quiet", "t1", "k", "", "m")
            })
            .unwrap();
            let busy = list(&db.conn(), "busy").unwrap();
            assert_eq!(busy.len() as i64, KEEP_PER_OBJECT);
            assert_eq!(busy[0].at, 3);
            assert_eq!(list(&db.conn(), "quiet").unwrap().len(), 1);
        });
    }

    /// The newest event deleted (a forgotten candidate's: nodes::forget_candidate), the
    /// next one still gets a number no stream has seen.
    #[test]
    fn a_deleted_events_number_is_never_given_again() {
        on_both(|db| {
            event(db, 1, "c1", "t1", "k", "");
            event(db, 2, "n1", "", "candidate", "n1");
            let gone = list(&db.conn(), "n1").unwrap()[0].seq;
            db.write(|c| c.execute("DELETE FROM events WHERE object_id = 'n1'", params![]))
                .unwrap();
            event(db, 3, "c1", "t1", "k", "");
            let after = stream(&db.conn(), None, gone, 10).unwrap();
            assert_eq!(after.len(), 1, "{after:?}");
            assert!(after[0].seq > gone);
        });
    }

    /// Writers on one PostgreSQL database, each with its own connection, record events
    /// at once while a reader follows the stream by its cursor, as a client does: the
    /// reader sees every event (no number was given out of commit order), and each
    /// tenant's own sequence is gap-free.
    #[test]
    fn writers_racing_on_postgres_number_events_in_commit_order() {
        const WRITERS: usize = 4;
        const EACH: usize = 40;
        let (_guard, mut db, url) = engines::postgres();
        let start = std::sync::Barrier::new(WRITERS + 1);
        let done = std::sync::atomic::AtomicUsize::new(0);
        let seen: Vec<EventRow> = std::thread::scope(|s| {
            for w in 0..WRITERS {
                let (url, start, done) = (url.clone(), &start, &done);
                s.spawn(move || {
                    let mut db = Database::postgres(&url).unwrap();
                    start.wait();
                    for i in 0..EACH {
                        let tenant = ["t1", "t2", ""][(w + i) % 3];
                        let object = format!("c{w}");
                        db.write(|c| record(c, i as i64, &object, tenant, "k", "", "m"))
                            .unwrap();
                    }
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                });
            }
            let reader = s.spawn(|| {
                let mut db = Database::postgres(&url).unwrap();
                start.wait();
                let mut seen = Vec::new();
                let mut cursor = 0;
                loop {
                    let finished = done.load(std::sync::atomic::Ordering::SeqCst) == WRITERS;
                    let page = db.read(|c| stream(c, None, cursor, 1000)).unwrap();
                    if let Some(last) = page.last() {
                        cursor = last.seq;
                    }
                    seen.extend(page);
                    if finished {
                        return seen;
                    }
                }
            });
            reader.join().unwrap()
        });
        let all = db.read(|c| stream(c, None, 0, 10_000)).unwrap();
        assert_eq!(all.len(), WRITERS * EACH);
        let seen: Vec<i64> = seen.iter().map(|e| e.seq).collect();
        let missed: Vec<i64> = all
            .iter()
            .map(|e| e.seq)
            .filter(|s| !seen.contains(s))
            .collect();
        assert!(missed.is_empty(), "the reader's stream missed {missed:?}");
        assert_eq!(seen.len(), all.len());
        for tenant in ["t1", "t2"] {
            let own: Vec<i64> = all
                .iter()
                .filter(|e| e.tenant_id == tenant)
                .map(|e| e.tenant_seq.unwrap())
                .collect();
            assert_eq!(own, (1..=own.len() as i64).collect::<Vec<_>>(), "{tenant}");
        }
    }
}
