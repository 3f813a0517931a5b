//! The automatic-quarantine breaker's records: each automatic quarantine of a GPU model
//! within the current window, and the models whose breaker is open (a row: open).

use gpufleet_sql::{params, AsConn, Row};

/// An open breaker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenRow {
    pub gpu_type: String,
    pub opened_at: i64,
    pub reason: String,
    /// Quarantines held back since it opened.
    pub held: i64,
}

fn open_row(r: &Row) -> gpufleet_sql::Result<OpenRow> {
    Ok(OpenRow {
        gpu_type: r.get(0)?,
        opened_at: r.get(1)?,
        reason: r.get(2)?,
        held: r.get(3)?,
    })
}

pub fn get_open(conn: &impl AsConn, gpu_type: &str) -> gpufleet_sql::Result<Option<OpenRow>> {
    conn.as_conn().query_opt(
        "SELECT gpu_type, opened_at, reason, held FROM quarantine_breakers WHERE gpu_type = ?1",
        params![gpu_type],
        open_row,
    )
}

pub fn list_open(conn: &impl AsConn) -> gpufleet_sql::Result<Vec<OpenRow>> {
    conn.as_conn().query_map(
        "SELECT gpu_type, opened_at, reason, held FROM quarantine_breakers ORDER BY gpu_type",
        params![],
        open_row,
    )
}

/// Opens the model's breaker (holding its first quarantine).
pub fn open(conn: &impl AsConn, gpu_type: &str, at: i64, reason: &str) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "INSERT INTO quarantine_breakers (gpu_type, opened_at, reason, held) VALUES (?1, ?2, ?3, 1)
         ON CONFLICT (gpu_type) DO NOTHING",
        params![gpu_type, at, reason],
    )?;
    Ok(())
}

/// One more quarantine held back by the open breaker.
pub fn hold(conn: &impl AsConn, gpu_type: &str) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE quarantine_breakers SET held = held + 1 WHERE gpu_type = ?1",
        params![gpu_type],
    )?;
    Ok(())
}

/// Closes the model's breaker and forgets its window's quarantines; whether it was open.
pub fn reset(conn: &impl AsConn, gpu_type: &str) -> gpufleet_sql::Result<bool> {
    let c = conn.as_conn();
    let closed = c.execute(
        "DELETE FROM quarantine_breakers WHERE gpu_type = ?1",
        params![gpu_type],
    )?;
    c.execute(
        "DELETE FROM automatic_quarantines WHERE gpu_type = ?1",
        params![gpu_type],
    )?;
    Ok(closed > 0)
}

/// Records an automatic quarantine at `at`, dropping the model's records from before
/// `window_start` (no longer counted).
pub fn record_quarantine(
    conn: &impl AsConn,
    gpu_type: &str,
    node_id: &str,
    at: i64,
    window_start: i64,
) -> gpufleet_sql::Result<()> {
    let c = conn.as_conn();
    c.execute(
        "DELETE FROM automatic_quarantines WHERE gpu_type = ?1 AND at <= ?2",
        params![gpu_type, window_start],
    )?;
    // seq (an identity column on PostgreSQL) is only a key: nothing reads it in order.
    c.execute(
        "INSERT INTO automatic_quarantines (gpu_type, node_id, at) VALUES (?1, ?2, ?3)",
        params![gpu_type, node_id, at],
    )?;
    Ok(())
}

/// The model's automatic quarantines after `window_start`.
pub fn quarantines_after(
    conn: &impl AsConn,
    gpu_type: &str,
    window_start: i64,
) -> gpufleet_sql::Result<i64> {
    conn.as_conn().query_row(
        "SELECT COUNT(*) FROM automatic_quarantines WHERE gpu_type = ?1 AND at > ?2",
        params![gpu_type, window_start],
        |r| r.get(0),
    )
}

/// Every node of the model, in service or not, and every model with nodes.
pub fn model_nodes(conn: &impl AsConn) -> gpufleet_sql::Result<Vec<(String, i64)>> {
    conn.as_conn().query_map(
        "SELECT gpu_type, COUNT(*) FROM nodes GROUP BY gpu_type ORDER BY gpu_type",
        params![],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::engines::on_both;

    #[test]
    fn quarantines_are_counted_in_the_window_and_a_reset_forgets_them() {
        on_both(|db| {
            let conn = db.conn();
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
        });
    }

    /// A breaker opened twice keeps its first opening; a record drops the model's older
    /// ones (only); every model with nodes is counted, quarantined nodes included.
    #[test]
    fn a_breaker_opens_once_and_old_records_are_dropped() {
        on_both(|db| {
            let conn = db.conn();
            open(&conn, "H100-80GB", 300, "first").unwrap();
            open(&conn, "H100-80GB", 400, "second").unwrap();
            assert_eq!(
                list_open(&conn).unwrap(),
                vec![OpenRow {
                    gpu_type: "H100-80GB".into(),
                    opened_at: 300,
                    reason: "first".into(),
                    held: 1,
                }]
            );
            record_quarantine(&conn, "H100-80GB", "a", 100, 0).unwrap();
            record_quarantine(&conn, "A100-80GB", "b", 100, 0).unwrap();
            record_quarantine(&conn, "H100-80GB", "c", 300, 100).unwrap();
            let left = conn
                .query_map(
                    "SELECT gpu_type, node_id FROM automatic_quarantines ORDER BY seq",
                    params![],
                    |r| Ok((r.get::<String>(0)?, r.get::<String>(1)?)),
                )
                .unwrap();
            assert_eq!(
                left,
                vec![
                    ("A100-80GB".to_string(), "b".to_string()),
                    ("H100-80GB".to_string(), "c".to_string())
                ]
            );
            assert!(model_nodes(&conn).unwrap().is_empty());
            conn.execute(
                "INSERT INTO nodes (id, hostname, gpu_type, capacity, gpu_count, driver_version, cuda_version, state)
                 VALUES ('n1', 'h1', 'H100-80GB', 'pool', 8, '', '', 'ready'),
                        ('n2', 'h2', 'H100-80GB', 'on-demand', 8, '', '', 'quarantined'),
                        ('n3', 'h3', 'A100-80GB', 'pool', 8, '', '', 'ready')",
                params![],
            )
            .unwrap();
            assert_eq!(
                model_nodes(&conn).unwrap(),
                vec![("A100-80GB".to_string(), 1), ("H100-80GB".to_string(), 2)]
            );
        });
    }
}
