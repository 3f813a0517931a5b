//! Bearer tokens: named, scoped, rotated with an overlap, revoked, expiring. Only the
//! SHA-256 hash of a secret is stored (migration 16).

use gpufleet_sql::{params, AsConn, Engine, Row};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRow {
    pub id: String,
    /// None: an admin-scoped token.
    pub tenant_id: Option<String>,
    pub name: String,
    pub scope: String,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub rotated_at: Option<i64>,
    pub retire_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

/// How long a refused token's row is kept, so a refusal can still say why.
pub const KEEP_REFUSED_SECONDS: i64 = 30 * 24 * 3600;
/// A token made to live at most this long (a run's ephemeral token) is forgotten as soon
/// as it is revoked (a run's close), and this long after it expired (a killed run's, or one
/// minted for an hour): nobody keeps such a secret long to learn why it stopped working,
/// and a team minting one per plan would otherwise fill its rows within a month.
pub const SHORT_LIVED_SECONDS: i64 = 24 * 3600;

/// Whether `t` was made to live at most [`SHORT_LIVED_SECONDS`].
pub fn is_short_lived(t: &TokenRow) -> bool {
    t.expires_at
        .is_some_and(|e| e - t.created_at <= SHORT_LIVED_SECONDS)
}

const COLUMNS: &str =
    "id, tenant_id, name, scope, created_at, expires_at, rotated_at, retire_at, revoked_at";

fn from_row(r: &Row) -> gpufleet_sql::Result<TokenRow> {
    Ok(TokenRow {
        id: r.get(0)?,
        tenant_id: r.get(1)?,
        name: r.get(2)?,
        scope: r.get(3)?,
        created_at: r.get(4)?,
        expires_at: r.get(5)?,
        rotated_at: r.get(6)?,
        retire_at: r.get(7)?,
        revoked_at: r.get(8)?,
    })
}

pub fn insert(conn: &impl AsConn, t: &TokenRow, hash: &str) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "INSERT INTO tokens (id, tenant_id, name, scope, hash, created_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![t.id, t.tenant_id, t.name, t.scope, hash, t.created_at, t.expires_at],
    )?;
    Ok(())
}

pub fn by_hash(conn: &impl AsConn, hash: &str) -> gpufleet_sql::Result<Option<TokenRow>> {
    conn.as_conn().query_opt(
        &format!("SELECT {COLUMNS} FROM tokens WHERE hash = ?1"),
        params![hash],
        from_row,
    )
}

pub fn by_id(conn: &impl AsConn, id: &str) -> gpufleet_sql::Result<Option<TokenRow>> {
    conn.as_conn().query_opt(
        &format!("SELECT {COLUMNS} FROM tokens WHERE id = ?1"),
        params![id],
        from_row,
    )
}

// An admin-scoped token's owner is NULL, compared as ''. COALESCE, not IFNULL
// (PostgreSQL has none), except in `live` on SQLite (`live_sql`).

/// `live`'s statement. The owner's test differs per engine so that each finds the row
/// through its `tokens_live_name` index: SQLite uses an expression index only for the
/// expression as the index writes it (IFNULL on SQLite; COALESCE scans the index), and
/// PostgreSQL's index is on COALESCE.
fn live_sql(engine: Engine) -> String {
    let owner = match engine {
        Engine::Sqlite => "IFNULL(tenant_id, '') = IFNULL(?1, '')",
        Engine::Postgres => "COALESCE(tenant_id, '') = COALESCE(?1, '')",
    };
    format!(
        "SELECT {COLUMNS} FROM tokens WHERE {owner} AND name = ?2
         AND rotated_at IS NULL AND revoked_at IS NULL"
    )
}

/// The live (neither rotated nor revoked) token of that name; expired ones included.
pub fn live(
    conn: &impl AsConn,
    tenant_id: Option<&str>,
    name: &str,
) -> gpufleet_sql::Result<Option<TokenRow>> {
    let c = conn.as_conn();
    c.query_opt(&live_sql(c.engine()), params![tenant_id, name], from_row)
}

/// Every row of one owner (a tenant, or None: the admin-scoped), by name, newest first.
pub fn list(conn: &impl AsConn, tenant_id: Option<&str>) -> gpufleet_sql::Result<Vec<TokenRow>> {
    conn.as_conn().query_map(
        &format!(
            "SELECT {COLUMNS} FROM tokens WHERE COALESCE(tenant_id, '') = COALESCE(?1, '')
             ORDER BY name, created_at DESC, id"
        ),
        params![tenant_id],
        from_row,
    )
}

/// Marks the live token of that name rotated at `now`, accepted until `retire_at`.
pub fn mark_rotated(
    conn: &impl AsConn,
    id: &str,
    now: i64,
    retire_at: i64,
) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE tokens SET rotated_at = ?2, retire_at = ?3 WHERE id = ?1",
        params![id, now, retire_at],
    )?;
    Ok(())
}

/// A new secret for an existing row (a retried create or rotation whose answer was lost).
pub fn set_hash(conn: &impl AsConn, id: &str, hash: &str) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE tokens SET hash = ?2 WHERE id = ?1",
        params![id, hash],
    )?;
    Ok(())
}

/// Revokes every secret of that name not yet revoked (the live one and any still in its
/// overlap). Returns how many.
pub fn revoke(
    conn: &impl AsConn,
    tenant_id: Option<&str>,
    name: &str,
    now: i64,
) -> gpufleet_sql::Result<usize> {
    conn.as_conn().execute(
        "UPDATE tokens SET revoked_at = ?3 WHERE COALESCE(tenant_id, '') = COALESCE(?1, '')
         AND name = ?2 AND revoked_at IS NULL",
        params![tenant_id, name, now],
    )
}

/// Forgets refused tokens (revoked, rotated past their overlap, expired) older than
/// [`KEEP_REFUSED_SECONDS`], and short-lived ones ([`SHORT_LIVED_SECONDS`]) once revoked or
/// a [`SHORT_LIVED_SECONDS`] after they expired.
pub fn forget_old(conn: &impl AsConn, now: i64) -> gpufleet_sql::Result<usize> {
    let before = now - KEEP_REFUSED_SECONDS;
    // CAST: PostgreSQL would otherwise take ?1, first seen in `?1 + 1`, for a 32-bit
    // integer.
    conn.as_conn().execute(
        "DELETE FROM tokens WHERE COALESCE(revoked_at, retire_at, expires_at, CAST(?1 AS BIGINT) + 1) < ?1 \
         OR (expires_at - created_at <= ?3 AND (revoked_at IS NOT NULL OR expires_at <= ?2 - ?3))",
        params![before, now, SHORT_LIVED_SECONDS],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::engines::on_both;

    fn row(tenant: Option<&str>, name: &str, at: i64) -> TokenRow {
        TokenRow {
            id: uuid::Uuid::new_v4().to_string(),
            tenant_id: tenant.map(str::to_string),
            name: name.into(),
            scope: "read".into(),
            created_at: at,
            expires_at: None,
            rotated_at: None,
            retire_at: None,
            revoked_at: None,
        }
    }

    #[test]
    fn one_live_token_per_name_and_owner() {
        on_both(|db| {
            let conn = db.conn();
            let first = row(None, "dash", 1);
            insert(&conn, &first, "h1").unwrap();
            assert!(insert(&conn, &row(None, "dash", 2), "h2").is_err());
            mark_rotated(&conn, &first.id, 5, 10).unwrap();
            insert(&conn, &row(None, "dash", 5), "h2").unwrap();
            assert_eq!(live(&conn, None, "dash").unwrap().unwrap().created_at, 5);
            assert_eq!(revoke(&conn, None, "dash", 6).unwrap(), 2);
            assert!(live(&conn, None, "dash").unwrap().is_none());
            assert_eq!(by_hash(&conn, "h1").unwrap().unwrap().revoked_at, Some(6));
            assert_eq!(forget_old(&conn, 6 + KEEP_REFUSED_SECONDS).unwrap(), 0);
            assert_eq!(forget_old(&conn, 7 + KEEP_REFUSED_SECONDS).unwrap(), 2);
        });
    }

    /// A tenant's token and an admin-scoped one of the same name are two owners' (the
    /// admin's owner is NULL, compared as ''), on both engines.
    #[test]
    fn a_tenants_token_and_an_admin_one_of_one_name_are_apart() {
        on_both(|db| {
            let conn = db.conn();
            conn.execute(
                "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
                 VALUES ('t1', 'team-1', '', '{}', 'ht', 0)",
                params![],
            )
            .unwrap();
            let admin = row(None, "ci", 1);
            let tenant = row(Some("t1"), "ci", 2);
            insert(&conn, &admin, "h1").unwrap();
            insert(&conn, &tenant, "h2").unwrap();
            assert_eq!(live(&conn, None, "ci").unwrap(), Some(admin.clone()));
            assert_eq!(live(&conn, Some("t1"), "ci").unwrap(), Some(tenant.clone()));
            assert_eq!(list(&conn, None).unwrap(), vec![admin.clone()]);
            assert_eq!(list(&conn, Some("t1")).unwrap(), vec![tenant.clone()]);
            assert_eq!(by_id(&conn, &tenant.id).unwrap(), Some(tenant.clone()));
            set_hash(&conn, &tenant.id, "h3").unwrap();
            assert!(by_hash(&conn, "h2").unwrap().is_none());
            assert_eq!(by_hash(&conn, "h3").unwrap(), Some(tenant));
            assert_eq!(revoke(&conn, Some("t1"), "ci", 3).unwrap(), 1);
            assert_eq!(live(&conn, None, "ci").unwrap(), Some(admin));
            // Newest first within a name.
            insert(&conn, &row(Some("t1"), "ci", 4), "h4").unwrap();
            let times: Vec<i64> = list(&conn, Some("t1"))
                .unwrap()
                .iter()
                .map(|t| t.created_at)
                .collect();
            assert_eq!(times, vec![4, 2]);
        });
    }

    #[test]
    fn a_short_lived_token_is_forgotten_once_revoked_or_a_day_after_it_expired_a_long_lived_one_kept_its_month(
    ) {
        on_both(|db| {
            let conn = db.conn();
            let run = TokenRow {
                expires_at: Some(100 + 3600),
                ..row(None, "ci-run-1", 100)
            };
            let hour = TokenRow {
                expires_at: Some(100 + 3600),
                ..row(None, "debug", 100)
            };
            let year = TokenRow {
                expires_at: Some(100 + 365 * 86_400),
                ..row(None, "ci", 100)
            };
            insert(&conn, &run, "h1").unwrap();
            insert(&conn, &hour, "h3").unwrap();
            insert(&conn, &year, "h2").unwrap();
            assert!(is_short_lived(&run) && !is_short_lived(&year));
            // Revoked at a run's close: forgotten at once, runs leave no rows behind.
            revoke(&conn, None, "ci-run-1", 200).unwrap();
            assert_eq!(forget_old(&conn, 201).unwrap(), 1);
            assert!(by_hash(&conn, "h1").unwrap().is_none());
            // Expired: kept (listed as expired) for a day, then forgotten.
            let expired = 100 + 3600;
            assert_eq!(
                forget_old(&conn, expired + SHORT_LIVED_SECONDS - 1).unwrap(),
                0
            );
            assert_eq!(forget_old(&conn, expired + SHORT_LIVED_SECONDS).unwrap(), 1);
            assert!(by_hash(&conn, "h3").unwrap().is_none());
            revoke(&conn, None, "ci", 300).unwrap();
            assert_eq!(
                forget_old(&conn, 300 + KEEP_REFUSED_SECONDS - 1).unwrap(),
                0
            );
            assert!(by_hash(&conn, "h2").unwrap().is_some());
        });
    }

    /// Timestamps beyond 32 bits: forget_old's parameters are BIGINT on PostgreSQL too.
    #[test]
    fn forgetting_takes_times_beyond_32_bits() {
        on_both(|db| {
            let conn = db.conn();
            let far = 1i64 << 40;
            let t = TokenRow {
                expires_at: Some(far + 10),
                ..row(None, "far", far)
            };
            insert(&conn, &t, "h1").unwrap();
            revoke(&conn, None, "far", far + 1).unwrap();
            assert_eq!(forget_old(&conn, far + 2).unwrap(), 1);
        });
    }

    /// `live` finds the row through the tokens_live_name index on both engines (its
    /// statement differs per engine for that).
    #[test]
    fn live_searches_the_live_name_index_on_both_engines() {
        on_both(|db| {
            let conn = db.conn();
            let sql = live_sql(conn.engine());
            let plan = match conn.engine() {
                Engine::Sqlite => conn.query_map(
                    &format!("EXPLAIN QUERY PLAN {sql}"),
                    params![None::<String>, "ci"],
                    |r| r.get::<String>(3),
                ),
                Engine::Postgres => {
                    // A few rows: without this the planner would rightly scan the table.
                    conn.execute_batch("SET enable_seqscan = off").unwrap();
                    conn.query_map(
                        &format!("EXPLAIN {sql}"),
                        params![None::<String>, "ci"],
                        |r| r.get::<String>(0),
                    )
                }
            }
            .unwrap()
            .join("\n");
            let wanted = match conn.engine() {
                Engine::Sqlite => "SEARCH tokens USING INDEX tokens_live_name",
                Engine::Postgres => "Index Scan using tokens_live_name",
            };
            assert!(plan.contains(wanted), "{plan}");
        });
    }
}
