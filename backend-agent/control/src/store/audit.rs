//! The audit log: who changed what, and every refused call (migration 16). A tenant's
//! entries carry a sequence of their own, so its cursors tell it nothing of others.

use rusqlite::Connection;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRow {
    /// The fleet-wide sequence (the admin's cursor).
    pub seq: i64,
    /// The tenant's own sequence; None for entries of no tenant.
    pub tenant_seq: Option<i64>,
    pub at: i64,
    pub tenant_id: String,
    pub token_name: String,
    pub token_scope: String,
    pub method: String,
    pub object: String,
    pub outcome: String,
    pub message: String,
}

/// Entries are kept this long ...
pub const KEEP_SECONDS: i64 = 90 * 24 * 3600;
/// ... and at most this many of callers with a valid token (the oldest go first) ...
pub const KEEP_ROWS: i64 = 200_000;
/// ... of which one tenant's at most this many: a team flooding refused calls with its
/// own token ages out only its own entries ...
pub const KEEP_TENANT_ROWS: i64 = 50_000;
/// ... and, apart, at most this many refusals of callers without one: anyone can make
/// those, so a flood of them ages out only its own kind, never who changed what.
pub const KEEP_UNIDENTIFIED_ROWS: i64 = 20_000;

/// How much of the log [`prune`] keeps.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub seconds: i64,
    pub identified_rows: i64,
    pub tenant_rows: i64,
    pub unidentified_rows: i64,
}

pub const RETENTION: Retention = Retention {
    seconds: KEEP_SECONDS,
    identified_rows: KEEP_ROWS,
    tenant_rows: KEEP_TENANT_ROWS,
    unidentified_rows: KEEP_UNIDENTIFIED_ROWS,
};

/// Whether an entry is of a caller without a valid token (no token name was learned).
pub fn unidentified(e: &AuditRow) -> bool {
    e.token_name.is_empty()
}

pub fn record(conn: &Connection, e: &AuditRow) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "INSERT INTO audit_log (tenant_seq, at, tenant_id, token_name, token_scope, method, object, outcome, message)
         VALUES (CASE WHEN ?2 = '' THEN NULL ELSE
                   (SELECT IFNULL(MAX(tenant_seq), 0) + 1 FROM audit_log WHERE tenant_id = ?2) END,
                 ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        rusqlite::params![
            e.at,
            e.tenant_id,
            e.token_name,
            e.token_scope,
            e.method,
            e.object,
            e.outcome,
            e.message
        ],
    )?;
    Ok(())
}

/// Drops entries past [`KEEP_SECONDS`], and beyond the newest [`KEEP_TENANT_ROWS`] of a
/// tenant, the newest [`KEEP_ROWS`] of callers with a valid token or the newest
/// [`KEEP_UNIDENTIFIED_ROWS`] of those without, each counted apart; never a tenant's
/// newest: its sequence continues from there.
pub fn prune(conn: &Connection, now: i64) -> rusqlite::Result<usize> {
    prune_within(conn, now, RETENTION)
}

/// [`prune`] with the bounds given.
pub fn prune_within(conn: &Connection, now: i64, keep: Retention) -> rusqlite::Result<usize> {
    let old = super::exec(
        conn,
        "DELETE FROM audit_log WHERE at < ?1 AND seq NOT IN (SELECT MAX(seq) FROM audit_log GROUP BY tenant_id)",
        [now - keep.seconds],
    )?;
    // A tenant's entries are a run of its own sequence (the oldest go first), so its
    // newest `tenant_rows` are those within that many of its greatest.
    let mut over = super::exec(
        conn,
        "DELETE FROM audit_log WHERE tenant_id != '' AND tenant_seq <= (
             SELECT MAX(t.tenant_seq) - ?1 FROM audit_log t WHERE t.tenant_id = audit_log.tenant_id)
         AND tenant_id IN (SELECT tenant_id FROM audit_log WHERE tenant_id != ''
                           GROUP BY tenant_id HAVING MAX(tenant_seq) - MIN(tenant_seq) >= ?1)",
        [keep.tenant_rows],
    )?;
    for (unidentified, rows) in [
        (true, keep.unidentified_rows),
        (false, keep.identified_rows),
    ] {
        // The newest `rows` of the kind stay; the one after them and older go.
        over += super::exec(
            conn,
            "DELETE FROM audit_log WHERE (token_name = '') = ?1
             AND seq <= (SELECT seq FROM audit_log WHERE (token_name = '') = ?1
                         ORDER BY seq DESC LIMIT 1 OFFSET ?2)
             AND seq NOT IN (SELECT MAX(seq) FROM audit_log GROUP BY tenant_id)",
            rusqlite::params![unidentified, rows],
        )?;
    }
    Ok(old + over)
}

fn from_row(r: &rusqlite::Row) -> rusqlite::Result<AuditRow> {
    Ok(AuditRow {
        seq: r.get(0)?,
        tenant_seq: r.get(1)?,
        at: r.get(2)?,
        tenant_id: r.get(3)?,
        token_name: r.get(4)?,
        token_scope: r.get(5)?,
        method: r.get(6)?,
        object: r.get(7)?,
        outcome: r.get(8)?,
        message: r.get(9)?,
    })
}

const COLUMNS: &str =
    "seq, tenant_seq, at, tenant_id, token_name, token_scope, method, object, outcome, message";

/// Entries after `after`, oldest first, at most `limit`: every one (`tenant` None,
/// `after` a fleet-wide seq) or one tenant's (`after` that tenant's own seq).
pub fn list(
    conn: &Connection,
    tenant: Option<&str>,
    after: i64,
    limit: i64,
) -> rusqlite::Result<Vec<AuditRow>> {
    let sql = match tenant {
        None => format!("SELECT {COLUMNS} FROM audit_log WHERE seq > ?1 AND ?2 IS NULL ORDER BY seq LIMIT ?3"),
        Some(_) => format!(
            "SELECT {COLUMNS} FROM audit_log WHERE tenant_id = ?2 AND tenant_seq > ?1 ORDER BY tenant_seq LIMIT ?3"
        ),
    };
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt.query_map(rusqlite::params![after, tenant, limit], from_row)?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tenant: &str, at: i64) -> AuditRow {
        AuditRow {
            seq: 0,
            tenant_seq: None,
            at,
            tenant_id: tenant.into(),
            token_name: "default".into(),
            token_scope: "write".into(),
            method: "gpufleet.v1.TenantService/UpdateTenant".into(),
            object: "x".into(),
            outcome: "OK".into(),
            message: String::new(),
        }
    }

    #[test]
    fn each_tenant_counts_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("s.db")).unwrap();
        for (t, at) in [("a", 1), ("b", 2), ("b", 3), ("", 4), ("a", 5)] {
            record(&conn, &entry(t, at)).unwrap();
        }
        let a: Vec<_> = list(&conn, Some("a"), 0, 10)
            .unwrap()
            .into_iter()
            .map(|e| (e.tenant_seq, e.at))
            .collect();
        assert_eq!(a, vec![(Some(1), 1), (Some(2), 5)]);
        assert_eq!(list(&conn, Some("b"), 1, 10).unwrap()[0].at, 3);
        assert_eq!(list(&conn, None, 0, 10).unwrap().len(), 5);
        assert_eq!(list(&conn, None, 3, 10).unwrap()[0].tenant_id, "");
        // "b"'s first goes; "a"'s first is its newest but one, and "b"'s second its newest.
        assert_eq!(prune(&conn, 3 + KEEP_SECONDS).unwrap(), 2);
        record(&conn, &entry("b", 6)).unwrap();
        assert_eq!(
            list(&conn, Some("b"), 2, 10).unwrap()[0].tenant_seq,
            Some(3)
        );
    }

    #[test]
    fn a_flood_of_refusals_without_a_token_never_pushes_out_a_teams_entries() {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("s.db")).unwrap();
        let keep = Retention {
            seconds: KEEP_SECONDS,
            identified_rows: 5,
            tenant_rows: 5,
            unidentified_rows: 3,
        };
        for at in 1..=4 {
            record(&conn, &entry("team-a", at)).unwrap();
        }
        let stranger = AuditRow {
            token_name: String::new(),
            token_scope: String::new(),
            outcome: "UNAUTHENTICATED".into(),
            ..entry("", 0)
        };
        for at in 10..110 {
            record(
                &conn,
                &AuditRow {
                    at,
                    ..stranger.clone()
                },
            )
            .unwrap();
            prune_within(&conn, 200, keep).unwrap();
        }
        let all = list(&conn, None, 0, 1000).unwrap();
        let team: Vec<i64> = all
            .iter()
            .filter(|e| !unidentified(e))
            .map(|e| e.at)
            .collect();
        assert_eq!(team, vec![1, 2, 3, 4], "the team's entries all stay");
        let strangers: Vec<i64> = all
            .iter()
            .filter(|e| unidentified(e))
            .map(|e| e.at)
            .collect();
        assert_eq!(strangers, vec![107, 108, 109], "the newest refusals only");
        // The team's own entries are bounded by their own count.
        for at in 200..203 {
            record(&conn, &entry("team-a", at)).unwrap();
        }
        prune_within(&conn, 300, keep).unwrap();
        let team: Vec<i64> = list(&conn, Some("team-a"), 0, 100)
            .unwrap()
            .iter()
            .map(|e| e.at)
            .collect();
        assert_eq!(team, vec![3, 4, 200, 201, 202]);
    }

    #[test]
    fn a_team_flooding_with_its_own_token_ages_out_only_its_own_entries() {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("s.db")).unwrap();
        let keep = Retention {
            seconds: KEEP_SECONDS,
            identified_rows: 100,
            tenant_rows: 4,
            unidentified_rows: 100,
        };
        for at in 1..=3 {
            record(&conn, &entry("quiet", at)).unwrap();
            record(&conn, &entry("", at)).unwrap();
        }
        for at in 10..60 {
            record(&conn, &entry("noisy", at)).unwrap();
            prune_within(&conn, 100, keep).unwrap();
        }
        let ats = |t: Option<&str>| -> Vec<i64> {
            list(&conn, t, 0, 1000)
                .unwrap()
                .iter()
                .filter(|e| t.is_some() || e.tenant_id.is_empty())
                .map(|e| e.at)
                .collect()
        };
        assert_eq!(ats(Some("noisy")), vec![56, 57, 58, 59]);
        assert_eq!(ats(Some("quiet")), vec![1, 2, 3]);
        assert_eq!(ats(None), vec![1, 2, 3], "the admin's entries stay");
        // Its sequence goes on from its newest.
        record(&conn, &entry("noisy", 60)).unwrap();
        assert_eq!(
            list(&conn, Some("noisy"), 0, 10)
                .unwrap()
                .last()
                .unwrap()
                .tenant_seq,
            Some(51)
        );
    }
}
