//! The automatic-quarantine breaker's records: each automatic quarantine of a GPU model
//! within the current window, and the models whose breaker is open (a row: open).

use rusqlite::{Connection, OptionalExtension};

/// An open breaker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenRow {
    pub gpu_type: String,
    pub opened_at: i64,
    pub reason: String,
    /// Quarantines held back since it opened.
    pub held: i64,
}

fn open_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<OpenRow> {
    Ok(OpenRow {
        gpu_type: r.get(0)?,
        opened_at: r.get(1)?,
        reason: r.get(2)?,
        held: r.get(3)?,
    })
}

pub fn get_open(conn: &Connection, gpu_type: &str) -> rusqlite::Result<Option<OpenRow>> {
    conn.prepare_cached(
        "SELECT gpu_type, opened_at, reason, held FROM quarantine_breakers WHERE gpu_type = ?1",
    )?
    .query_row([gpu_type], open_row)
    .optional()
}

pub fn list_open(conn: &Connection) -> rusqlite::Result<Vec<OpenRow>> {
    let mut stmt = conn.prepare_cached(
        "SELECT gpu_type, opened_at, reason, held FROM quarantine_breakers ORDER BY gpu_type",
    )?;
    let rows = stmt.query_map([], open_row)?;
    rows.collect()
}

/// Opens the model's breaker (holding its first quarantine).
pub fn open(conn: &Connection, gpu_type: &str, at: i64, reason: &str) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "INSERT INTO quarantine_breakers (gpu_type, opened_at, reason, held) VALUES (?1, ?2, ?3, 1)
         ON CONFLICT (gpu_type) DO NOTHING",
        rusqlite::params![gpu_type, at, reason],
    )?;
    Ok(())
}

/// One more quarantine held back by the open breaker.
pub fn hold(conn: &Connection, gpu_type: &str) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "UPDATE quarantine_breakers SET held = held + 1 WHERE gpu_type = ?1",
        [gpu_type],
    )?;
    Ok(())
}

/// Closes the model's breaker and forgets its window's quarantines; whether it was open.
pub fn reset(conn: &Connection, gpu_type: &str) -> rusqlite::Result<bool> {
    let closed = super::exec(
        conn,
        "DELETE FROM quarantine_breakers WHERE gpu_type = ?1",
        [gpu_type],
    )?;
    super::exec(
        conn,
        "DELETE FROM automatic_quarantines WHERE gpu_type = ?1",
        [gpu_type],
    )?;
    Ok(closed > 0)
}

/// Records an automatic quarantine at `at`, dropping the model's records from before
/// `window_start` (no longer counted).
pub fn record_quarantine(
    conn: &Connection,
    gpu_type: &str,
    node_id: &str,
    at: i64,
    window_start: i64,
) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "DELETE FROM automatic_quarantines WHERE gpu_type = ?1 AND at <= ?2",
        rusqlite::params![gpu_type, window_start],
    )?;
    super::exec(
        conn,
        "INSERT INTO automatic_quarantines (gpu_type, node_id, at) VALUES (?1, ?2, ?3)",
        rusqlite::params![gpu_type, node_id, at],
    )?;
    Ok(())
}

/// The model's automatic quarantines after `window_start`.
pub fn quarantines_after(
    conn: &Connection,
    gpu_type: &str,
    window_start: i64,
) -> rusqlite::Result<i64> {
    conn.prepare_cached(
        "SELECT COUNT(*) FROM automatic_quarantines WHERE gpu_type = ?1 AND at > ?2",
    )?
    .query_row(rusqlite::params![gpu_type, window_start], |r| r.get(0))
}

/// Every node of the model, in service or not, and every model with nodes.
pub fn model_nodes(conn: &Connection) -> rusqlite::Result<Vec<(String, i64)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT gpu_type, COUNT(*) FROM nodes GROUP BY gpu_type ORDER BY gpu_type",
    )?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quarantines_are_counted_in_the_window_and_a_reset_forgets_them() {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("s.db")).unwrap();
        record_quarantine(&conn, "H100-80GB", "a", 100, 0).unwrap();
        record_quarantine(&conn, "H100-80GB", "b", 200, 0).unwrap();
        record_quarantine(&conn, "A100-80GB", "c", 200, 0).unwrap();
        assert_eq!(quarantines_after(&conn, "H100-80GB", 0).unwrap(), 2);
        assert_eq!(quarantines_after(&conn, "H100-80GB", 100).unwrap(), 1);
        assert_eq!(get_open(&conn, "H100-80GB").unwrap(), None);
        open(&conn, "H100-80GB", 300, "why").unwrap();
        hold(&conn, "H100-80GB").unwrap();
        let row = get_open(&conn, "H100-80GB").unwrap().unwrap();
        assert_eq!(
            (row.opened_at, row.held, row.reason.as_str()),
            (300, 2, "why")
        );
        assert_eq!(list_open(&conn).unwrap().len(), 1);
        assert!(reset(&conn, "H100-80GB").unwrap());
        assert!(!reset(&conn, "H100-80GB").unwrap());
        assert_eq!(quarantines_after(&conn, "H100-80GB", 0).unwrap(), 0);
        assert_eq!(quarantines_after(&conn, "A100-80GB", 0).unwrap(), 1);
    }
}
