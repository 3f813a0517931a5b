//! Idempotent creates: a retried create with the same request id finds the first object.

use rusqlite::{Connection, OptionalExtension};

use crate::fingerprint::Fingerprint;

/// The outcome of looking up a request id.
pub enum Prior {
    /// Never seen: create the object.
    New,
    /// Seen with the same parameters: answer with this object.
    Same(String),
    /// Seen with different parameters: the caller reused a request id by mistake.
    Conflict,
}

pub fn lookup(
    conn: &Connection,
    kind: &str,
    scope: &str,
    request_id: &str,
    fingerprint: &Fingerprint,
) -> rusqlite::Result<Prior> {
    let mut stmt = conn.prepare_cached(
        "SELECT fingerprint, object_id FROM idempotency WHERE kind = ?1 AND scope = ?2 AND request_id = ?3",
    )?;
    let row: Option<(String, String)> = stmt
        .query_row((kind, scope, request_id), |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(match row {
        None => Prior::New,
        Some((seen, id)) if fingerprint.matches(&seen) => Prior::Same(id),
        Some(_) => Prior::Conflict,
    })
}

pub fn record(
    conn: &Connection,
    kind: &str,
    scope: &str,
    request_id: &str,
    fingerprint: &Fingerprint,
    object_id: &str,
) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare_cached("INSERT INTO idempotency (kind, scope, request_id, fingerprint, object_id) VALUES (?1, ?2, ?3, ?4, ?5)")?;
    stmt.execute((kind, scope, request_id, &fingerprint.current, object_id))?;
    Ok(())
}

/// Forgets the request ids of a deleted object, so a later create with one makes a new object.
pub fn forget(conn: &Connection, object_id: &str) -> rusqlite::Result<()> {
    conn.execute("DELETE FROM idempotency WHERE object_id = ?1", [object_id])?;
    Ok(())
}

/// Forgets one request id (whose object is gone), so that the same request makes a new one.
pub fn forget_request(
    conn: &Connection,
    kind: &str,
    scope: &str,
    request_id: &str,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "DELETE FROM idempotency WHERE kind = ?1 AND scope = ?2 AND request_id = ?3",
    )?
    .execute((kind, scope, request_id))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forgotten_request_id_is_new_again() {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("s.db")).unwrap();
        let f = Fingerprint::of(&[&"request".to_string()]);
        record(&conn, "cluster", "t1", "r1", &f, "c1").unwrap();
        record(&conn, "cluster", "t2", "r1", &f, "c2").unwrap();
        assert!(
            matches!(lookup(&conn, "cluster", "t1", "r1", &f).unwrap(), Prior::Same(id) if id == "c1")
        );
        forget_request(&conn, "cluster", "t1", "r1").unwrap();
        assert!(matches!(
            lookup(&conn, "cluster", "t1", "r1", &f).unwrap(),
            Prior::New
        ));
        // Another scope's use of the same id stays.
        assert!(
            matches!(lookup(&conn, "cluster", "t2", "r1", &f).unwrap(), Prior::Same(id) if id == "c2")
        );
        // Recorded anew, the id points at the new object.
        record(&conn, "cluster", "t1", "r1", &f, "c3").unwrap();
        assert!(
            matches!(lookup(&conn, "cluster", "t1", "r1", &f).unwrap(), Prior::Same(id) if id == "c3")
        );
    }

    #[test]
    fn a_request_id_stored_before_the_stable_encoding_is_still_a_retry() {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("s.db")).unwrap();
        let fields: [&dyn crate::fingerprint::Canonical; 2] = [&"team-a".to_string(), &8i32];
        let f = Fingerprint::of(&fields);
        // As the previous release recorded it.
        conn.execute(
            "INSERT INTO idempotency (kind, scope, request_id, fingerprint, object_id) VALUES ('quota', 't', 'r1', ?1, 'q1')",
            [&f.legacy],
        )
        .unwrap();
        assert!(
            matches!(lookup(&conn, "quota", "t", "r1", &f).unwrap(), Prior::Same(id) if id == "q1")
        );
        let other = Fingerprint::of(&[&"team-a".to_string(), &9i32]);
        assert!(matches!(
            lookup(&conn, "quota", "t", "r1", &other).unwrap(),
            Prior::Conflict
        ));
    }
}
