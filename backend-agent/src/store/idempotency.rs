//! Idempotent creates: a retried create with the same request id finds the first object.

use rusqlite::{Connection, OptionalExtension};

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
    fingerprint: &str,
) -> rusqlite::Result<Prior> {
    let row: Option<(String, String)> = conn
        .query_row(
            "SELECT fingerprint, object_id FROM idempotency WHERE kind = ?1 AND scope = ?2 AND request_id = ?3",
            (kind, scope, request_id),
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    Ok(match row {
        None => Prior::New,
        Some((seen, id)) if seen == fingerprint => Prior::Same(id),
        Some(_) => Prior::Conflict,
    })
}

pub fn record(
    conn: &Connection,
    kind: &str,
    scope: &str,
    request_id: &str,
    fingerprint: &str,
    object_id: &str,
) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO idempotency (kind, scope, request_id, fingerprint, object_id) VALUES (?1, ?2, ?3, ?4, ?5)",
        (kind, scope, request_id, fingerprint, object_id),
    )?;
    Ok(())
}

/// Forgets the request ids of a deleted object, so a later create with one makes a new object.
pub fn forget(conn: &Connection, object_id: &str) -> rusqlite::Result<()> {
    conn.execute("DELETE FROM idempotency WHERE object_id = ?1", [object_id])?;
    Ok(())
}
