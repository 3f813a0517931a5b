//! Idempotent creates: a retried create with the same request id finds the first object.
//! The same statements run on SQLite and PostgreSQL (`gpufleet_sql`).

use gpufleet_sql::{params, AsConn};

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
    conn: &impl AsConn,
    kind: &str,
    scope: &str,
    request_id: &str,
    fingerprint: &Fingerprint,
) -> gpufleet_sql::Result<Prior> {
    let row: Option<(String, String)> = conn.as_conn().query_opt(
        "SELECT fingerprint, object_id FROM idempotency WHERE kind = ?1 AND scope = ?2 AND request_id = ?3",
        params![kind, scope, request_id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok(match row {
        None => Prior::New,
        Some((seen, id)) if fingerprint.matches(&seen) => Prior::Same(id),
        Some(_) => Prior::Conflict,
    })
}

pub fn record(
    conn: &impl AsConn,
    kind: &str,
    scope: &str,
    request_id: &str,
    fingerprint: &Fingerprint,
    object_id: &str,
) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "INSERT INTO idempotency (kind, scope, request_id, fingerprint, object_id) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![kind, scope, request_id, fingerprint.current, object_id],
    )?;
    Ok(())
}

/// Forgets the request ids of a deleted object, so a later create with one makes a new object.
pub fn forget(conn: &impl AsConn, object_id: &str) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "DELETE FROM idempotency WHERE object_id = ?1",
        params![object_id],
    )?;
    Ok(())
}

/// Forgets one request id (whose object is gone), so that the same request makes a new one.
pub fn forget_request(
    conn: &impl AsConn,
    kind: &str,
    scope: &str,
    request_id: &str,
) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "DELETE FROM idempotency WHERE kind = ?1 AND scope = ?2 AND request_id = ?3",
        params![kind, scope, request_id],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::engines::on_both;

    #[test]
    fn a_forgotten_request_id_is_new_again() {
        on_both(|db| {
            let conn = db.conn();
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
            // A deleted object's ids are all forgotten.
            forget(&conn, "c3").unwrap();
            assert!(matches!(
                lookup(&conn, "cluster", "t1", "r1", &f).unwrap(),
                Prior::New
            ));
            // The same id twice in one scope is refused by the key.
            assert!(record(&conn, "cluster", "t2", "r1", &f, "c4").is_err());
        });
    }

    #[test]
    fn a_request_id_stored_before_the_stable_encoding_is_still_a_retry() {
        on_both(|db| {
            let conn = db.conn();
            let fields: [&dyn crate::fingerprint::Canonical; 2] = [&"team-a".to_string(), &8i32];
            let f = Fingerprint::of(&fields);
            // As the previous release recorded it.
            conn.execute(
                "INSERT INTO idempotency (kind, scope, request_id, fingerprint, object_id) VALUES ('quota', 't', 'r1', ?1, 'q1')",
                params![f.legacy],
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
        });
    }
}
