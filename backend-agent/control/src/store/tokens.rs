//! Bearer tokens: named, scoped, rotated with an overlap, revoked, expiring. Only the
//! SHA-256 hash of a secret is stored (migration 16).

use rusqlite::{Connection, OptionalExtension, Row};

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

fn from_row(r: &Row) -> rusqlite::Result<TokenRow> {
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

pub fn insert(conn: &Connection, t: &TokenRow, hash: &str) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "INSERT INTO tokens (id, tenant_id, name, scope, hash, created_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        rusqlite::params![t.id, t.tenant_id, t.name, t.scope, hash, t.created_at, t.expires_at],
    )?;
    Ok(())
}

pub fn by_hash(conn: &Connection, hash: &str) -> rusqlite::Result<Option<TokenRow>> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM tokens WHERE hash = ?1"))?
        .query_row([hash], from_row)
        .optional()
}

pub fn by_id(conn: &Connection, id: &str) -> rusqlite::Result<Option<TokenRow>> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM tokens WHERE id = ?1"))?
        .query_row([id], from_row)
        .optional()
}

/// The live (neither rotated nor revoked) token of that name; expired ones included.
pub fn live(
    conn: &Connection,
    tenant_id: Option<&str>,
    name: &str,
) -> rusqlite::Result<Option<TokenRow>> {
    conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM tokens WHERE IFNULL(tenant_id, '') = IFNULL(?1, '') AND name = ?2
         AND rotated_at IS NULL AND revoked_at IS NULL"
    ))?
    .query_row(rusqlite::params![tenant_id, name], from_row)
    .optional()
}

/// Every row of one owner (a tenant, or None: the admin-scoped), by name, newest first.
pub fn list(conn: &Connection, tenant_id: Option<&str>) -> rusqlite::Result<Vec<TokenRow>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM tokens WHERE IFNULL(tenant_id, '') = IFNULL(?1, '')
         ORDER BY name, created_at DESC, id"
    ))?;
    let rows = stmt.query_map(rusqlite::params![tenant_id], from_row)?;
    rows.collect()
}

/// Marks the live token of that name rotated at `now`, accepted until `retire_at`.
pub fn mark_rotated(conn: &Connection, id: &str, now: i64, retire_at: i64) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "UPDATE tokens SET rotated_at = ?2, retire_at = ?3 WHERE id = ?1",
        rusqlite::params![id, now, retire_at],
    )?;
    Ok(())
}

/// A new secret for an existing row (a retried create or rotation whose answer was lost).
pub fn set_hash(conn: &Connection, id: &str, hash: &str) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "UPDATE tokens SET hash = ?2 WHERE id = ?1",
        rusqlite::params![id, hash],
    )?;
    Ok(())
}

/// Revokes every secret of that name not yet revoked (the live one and any still in its
/// overlap). Returns how many.
pub fn revoke(
    conn: &Connection,
    tenant_id: Option<&str>,
    name: &str,
    now: i64,
) -> rusqlite::Result<usize> {
    super::exec(
        conn,
        "UPDATE tokens SET revoked_at = ?3 WHERE IFNULL(tenant_id, '') = IFNULL(?1, '')
         AND name = ?2 AND revoked_at IS NULL",
        rusqlite::params![tenant_id, name, now],
    )
}

/// Forgets refused tokens (revoked, rotated past their overlap, expired) older than
/// [`KEEP_REFUSED_SECONDS`], and short-lived ones ([`SHORT_LIVED_SECONDS`]) once revoked or
/// a [`SHORT_LIVED_SECONDS`] after they expired.
pub fn forget_old(conn: &Connection, now: i64) -> rusqlite::Result<usize> {
    let before = now - KEEP_REFUSED_SECONDS;
    super::exec(
        conn,
        "DELETE FROM tokens WHERE IFNULL(revoked_at, IFNULL(retire_at, IFNULL(expires_at, ?1 + 1))) < ?1 \
         OR (expires_at - created_at <= ?3 AND (revoked_at IS NOT NULL OR expires_at <= ?2 - ?3))",
        [before, now, SHORT_LIVED_SECONDS],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("s.db")).unwrap();
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
    }

    #[test]
    fn a_short_lived_token_is_forgotten_once_revoked_or_a_day_after_it_expired_a_long_lived_one_kept_its_month(
    ) {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("s.db")).unwrap();
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
    }
}
