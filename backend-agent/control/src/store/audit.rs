//! The audit log: who changed what, and every refused call. A tenant's entries carry a
//! sequence of their own, so its cursors tell it nothing of others.
//!
//! Append-only as chains: every entry carries the SHA-256 of the entry before it in its
//! chain ([`entry_hash`]) and its place there (`chain_seq`). There is one chain per
//! tenant (the calls of its own tokens, and copies of the admin's calls on its objects:
//! its view is one run of its chain), one for the admin and one for callers without a
//! valid token, so that each is pruned oldest
//! first and stays whole: `audit_chains` records where each starts (moved forward, with
//! the hash its first kept entry carries, as entries are pruned) and its newest entry. An
//! edited or deleted entry breaks its chain where `audit --verify` finds it
//! (`crate::audit::chain`). Entries from before the chains stay, unchained, ahead of them.

use rusqlite::{Connection, OptionalExtension};
use sha2::{Digest, Sha256};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRow {
    /// The fleet-wide sequence (the admin's cursor).
    pub seq: i64,
    /// The tenant's own sequence; None for entries of no tenant.
    pub tenant_seq: Option<i64>,
    pub at: i64,
    /// Whose object (the tenant of the token, or the team an admin call acted on).
    pub tenant_id: String,
    /// The caller was the admin (its token or an admin-scoped one).
    pub by_admin: bool,
    pub token_name: String,
    pub token_scope: String,
    pub method: String,
    pub object: String,
    pub outcome: String,
    pub message: String,
}

/// The admin's chain.
pub const ADMIN_CHAIN: &str = "";
/// The chain of callers without a valid token.
pub const UNIDENTIFIED_CHAIN: &str = "*";

/// The chain an entry belongs to: its tenant's (the team's own calls, and its copies of
/// the admin's calls on its objects), the admin's, or that of callers without a valid
/// token.
pub fn chain_of(e: &AuditRow) -> &str {
    if !e.tenant_id.is_empty() {
        &e.tenant_id
    } else if e.by_admin || !e.token_name.is_empty() {
        ADMIN_CHAIN
    } else {
        UNIDENTIFIED_CHAIN
    }
}

/// Whether an entry is a team's copy of an admin's call on its objects (the admin's
/// own entry, of no tenant, is in the admin's chain).
pub fn is_copy(e: &AuditRow) -> bool {
    e.by_admin && !e.tenant_id.is_empty()
}

/// The hash a chain's first entry carries of the (no) entry before it.
pub const GENESIS: [u8; 32] = [0; 32];

/// The SHA-256 of an entry as chained: every field, its chain, its place there and the
/// hash of the one before, each length-prefixed so no two entries encode alike.
pub fn entry_hash(e: &AuditRow, chain: &str, chain_seq: i64, prev: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"gpufleet audit entry v1\0");
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    field(&e.seq.to_be_bytes());
    match e.tenant_seq {
        Some(n) => field(&n.to_be_bytes()),
        None => field(&[]),
    }
    field(&e.at.to_be_bytes());
    field(e.tenant_id.as_bytes());
    field(&[u8::from(e.by_admin)]);
    for text in [
        &e.token_name,
        &e.token_scope,
        &e.method,
        &e.object,
        &e.outcome,
        &e.message,
    ] {
        field(text.as_bytes());
    }
    field(chain.as_bytes());
    field(&chain_seq.to_be_bytes());
    field(prev);
    h.finalize().into()
}

/// Entries are kept this long ...
pub const KEEP_SECONDS: i64 = 90 * 24 * 3600;
/// ... and at most this many of callers with a valid token (the oldest go first) ...
pub const KEEP_ROWS: i64 = 200_000;
/// ... of which one tenant's own at most this many: a team flooding refused calls with
/// its own token ages out only its own entries ...
pub const KEEP_TENANT_ROWS: i64 = 50_000;
/// ... and, apart, at most this many refusals of callers without one: anyone can make
/// those, so a flood of them ages out only its own kind, never who changed what.
pub const KEEP_UNIDENTIFIED_ROWS: i64 = 20_000;

/// How much of the log [`prune`] keeps (serve's `--audit-keep*` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

impl Default for Retention {
    fn default() -> Self {
        RETENTION
    }
}

/// Whether an entry is of a caller without a valid token.
pub fn unidentified(e: &AuditRow) -> bool {
    chain_of(e) == UNIDENTIFIED_CHAIN
}

/// Appends an entry to its chain, inside the caller's transaction (the audit writer's
/// batch): 3 or 4 statements on primary keys. An admin's call on a team's objects
/// (`tenant_id` the team's, `by_admin`) is written twice: the admin's entry, of no
/// tenant, and the team's copy, so that each is pruned with its own chain (a team's
/// flood never ages out the admin's record) and the team's view is one run of its chain.
pub fn record(conn: &Connection, e: &AuditRow) -> rusqlite::Result<()> {
    if is_copy(e) {
        append(
            conn,
            &AuditRow {
                tenant_id: String::new(),
                ..e.clone()
            },
        )?;
    }
    append(conn, e)
}

fn append(conn: &Connection, e: &AuditRow) -> rusqlite::Result<()> {
    let chain = chain_of(e);
    let head: Option<(i64, Vec<u8>)> = conn
        .prepare_cached("SELECT head_chain_seq, head_hash FROM audit_chains WHERE chain = ?1")?
        .query_row([chain], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let (chain_seq, prev) = match &head {
        Some((n, hash)) => (n + 1, hash.clone()),
        None => (1, GENESIS.to_vec()),
    };
    // A tenant's sequence never goes back, whatever was pruned.
    let tenant_seq: Option<i64> = if e.tenant_id.is_empty() {
        None
    } else {
        Some(
            conn.prepare_cached(
                "INSERT INTO audit_tenant_seqs (tenant_id, last) VALUES (?1, 1)
                 ON CONFLICT (tenant_id) DO UPDATE SET last = last + 1 RETURNING last",
            )?
            .query_row([&e.tenant_id], |r| r.get(0))?,
        )
    };
    let seq: i64 = conn
        .prepare_cached(
            "INSERT INTO audit_log (tenant_seq, at, tenant_id, by_admin, token_name, token_scope,
                 method, object, outcome, message, chain, chain_seq, prev_hash)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) RETURNING seq",
        )?
        .query_row(
            rusqlite::params![
                tenant_seq,
                e.at,
                e.tenant_id,
                e.by_admin,
                e.token_name,
                e.token_scope,
                e.method,
                e.object,
                e.outcome,
                e.message,
                chain,
                chain_seq,
                prev
            ],
            |r| r.get(0),
        )?;
    let written = AuditRow {
        seq,
        tenant_seq,
        ..e.clone()
    };
    let hash = entry_hash(&written, chain, chain_seq, &prev);
    if head.is_some() {
        super::exec(
            conn,
            "UPDATE audit_chains SET head_seq = ?2, head_chain_seq = ?3, head_hash = ?4 WHERE chain = ?1",
            rusqlite::params![chain, seq, chain_seq, hash.to_vec()],
        )?;
    } else {
        super::exec(
            conn,
            "INSERT INTO audit_chains (chain, start_seq, start_chain_seq, start_prev_hash,
                 head_seq, head_chain_seq, head_hash, pruned)
             VALUES (?1, ?2, 1, ?3, ?2, 1, ?4, 0)",
            rusqlite::params![chain, seq, GENESIS.to_vec(), hash.to_vec()],
        )?;
    }
    Ok(())
}

/// Drops entries older than [`KEEP_SECONDS`], beyond the newest [`KEEP_TENANT_ROWS`] of a
/// tenant's chain, the newest [`KEEP_ROWS`] of callers with a valid token or the newest
/// [`KEEP_UNIDENTIFIED_ROWS`] of those without.
pub fn prune(conn: &Connection, now: i64) -> rusqlite::Result<usize> {
    prune_within(conn, now, RETENTION)
}

/// [`prune`] with the bounds given. Each chain loses a run of its oldest entries only
/// (an entry kept for its age keeps every later one of its chain, even one older by a
/// clock that went back), and its recorded start moves past them.
pub fn prune_within(conn: &Connection, now: i64, keep: Retention) -> rusqlite::Result<usize> {
    // Per chain: its entries before this fleet-wide seq go.
    let mut cuts: std::collections::BTreeMap<String, i64> = Default::default();
    let mut raise = |chain: String, cut: i64| {
        let c = cuts.entry(chain).or_insert(cut);
        *c = (*c).max(cut);
    };
    let cutoff = now.saturating_sub(keep.seconds);
    for chain in strings(
        conn,
        "SELECT DISTINCT chain FROM audit_log INDEXED BY audit_log_at WHERE at < ?1",
        [cutoff],
    )? {
        // The first entry young enough; none: every entry goes.
        let first_young: Option<i64> = conn
            .prepare_cached(
                "SELECT seq FROM audit_log INDEXED BY audit_log_chain
                 WHERE chain = ?1 AND at >= ?2 ORDER BY seq LIMIT 1",
            )?
            .query_row(rusqlite::params![chain, cutoff], |r| r.get(0))
            .optional()?;
        raise(chain, first_young.unwrap_or(i64::MAX));
    }
    for chain in strings(
        conn,
        "SELECT chain FROM audit_log INDEXED BY audit_log_chain WHERE chain NOT IN ('', '*')
         GROUP BY chain HAVING COUNT(*) > ?1",
        [keep.tenant_rows],
    )? {
        let oldest_kept = nth_newest(
            conn,
            "SELECT seq FROM audit_log INDEXED BY audit_log_chain WHERE chain = ?1
             ORDER BY seq DESC LIMIT 1 OFFSET ?2",
            &chain,
            keep.tenant_rows,
        )?;
        raise(chain, oldest_kept);
    }
    // Of callers with a valid token, fleet-wide: a run of the oldest of each chain.
    let oldest_kept = nth_newest(
        conn,
        "SELECT seq FROM audit_log WHERE chain != ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2",
        UNIDENTIFIED_CHAIN,
        keep.identified_rows,
    )?;
    for chain in strings(
        conn,
        "SELECT DISTINCT chain FROM audit_log WHERE seq < ?1 AND chain != '*'",
        [oldest_kept],
    )? {
        raise(chain, oldest_kept);
    }
    let oldest_kept = nth_newest(
        conn,
        "SELECT seq FROM audit_log INDEXED BY audit_log_chain WHERE chain = ?1
         ORDER BY seq DESC LIMIT 1 OFFSET ?2",
        UNIDENTIFIED_CHAIN,
        keep.unidentified_rows,
    )?;
    raise(UNIDENTIFIED_CHAIN.into(), oldest_kept);

    let mut pruned = 0;
    for (chain, cut) in cuts {
        let gone = super::exec(
            conn,
            "DELETE FROM audit_log WHERE chain = ?1 AND seq < ?2",
            rusqlite::params![chain, cut],
        )?;
        if gone > 0 {
            move_start(conn, &chain)?;
        }
        pruned += gone;
    }
    Ok(pruned)
}

/// Rows of one text column.
fn strings<P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map(params, |r| r.get(0))?;
    rows.collect()
}

/// The seq of the `n`th newest entry the query finds (`?1`: `arg`, `?2`: the offset);
/// 0 when there are fewer (nothing goes).
fn nth_newest(conn: &Connection, sql: &str, arg: &str, n: i64) -> rusqlite::Result<i64> {
    if n < 1 {
        return Ok(i64::MAX);
    }
    Ok(conn
        .prepare_cached(sql)?
        .query_row(rusqlite::params![arg, n - 1], |r| r.get(0))
        .optional()?
        .unwrap_or(0))
}

/// Records that `chain` now starts at its first chained entry left (or, with none left,
/// right after its newest), with the hash that entry carries.
fn move_start(conn: &Connection, chain: &str) -> rusqlite::Result<()> {
    let first: Option<(i64, i64, Vec<u8>)> = conn
        .prepare_cached(
            "SELECT seq, chain_seq, prev_hash FROM audit_log INDEXED BY audit_log_chain
             WHERE chain = ?1 AND chain_seq IS NOT NULL ORDER BY seq LIMIT 1",
        )?
        .query_row([chain], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    match first {
        Some((seq, chain_seq, prev)) => super::exec(
            conn,
            "UPDATE audit_chains SET pruned = pruned + (?3 - start_chain_seq),
                 start_seq = ?2, start_chain_seq = ?3, start_prev_hash = ?4
             WHERE chain = ?1 AND start_chain_seq < ?3",
            rusqlite::params![chain, seq, chain_seq, prev],
        )?,
        // None left: the next entry starts it, after the recorded newest.
        None => super::exec(
            conn,
            "UPDATE audit_chains SET pruned = pruned + (head_chain_seq + 1 - start_chain_seq),
                 start_seq = head_seq + 1, start_chain_seq = head_chain_seq + 1,
                 start_prev_hash = head_hash
             WHERE chain = ?1 AND start_chain_seq <= head_chain_seq",
            [chain],
        )?,
    };
    Ok(())
}

fn from_row(r: &rusqlite::Row) -> rusqlite::Result<AuditRow> {
    Ok(AuditRow {
        seq: r.get(0)?,
        tenant_seq: r.get(1)?,
        at: r.get(2)?,
        tenant_id: r.get(3)?,
        by_admin: r.get(4)?,
        token_name: r.get(5)?,
        token_scope: r.get(6)?,
        method: r.get(7)?,
        object: r.get(8)?,
        outcome: r.get(9)?,
        message: r.get(10)?,
    })
}

const COLUMNS: &str = "seq, tenant_seq, at, tenant_id, by_admin, token_name, token_scope, method, object, outcome, message";

/// Entries after `after`, oldest first, at most `limit`: every one (`tenant` None,
/// `after` a fleet-wide seq) or one tenant's (`after` that tenant's own seq).
pub fn list(
    conn: &Connection,
    tenant: Option<&str>,
    after: i64,
    limit: i64,
) -> rusqlite::Result<Vec<AuditRow>> {
    let sql = match tenant {
        // Teams' copies of the admin's entries are not shown twice.
        None => format!("SELECT {COLUMNS} FROM audit_log WHERE seq > ?1 AND ?2 IS NULL AND NOT (by_admin AND tenant_id != '') ORDER BY seq LIMIT ?3"),
        Some(_) => format!(
            "SELECT {COLUMNS} FROM audit_log WHERE tenant_id = ?2 AND tenant_seq > ?1 ORDER BY tenant_seq LIMIT ?3"
        ),
    };
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt.query_map(rusqlite::params![after, tenant, limit], from_row)?;
    rows.collect()
}

/// An entry with its place in its chain, as stored.
#[derive(Debug, Clone)]
pub struct Link {
    pub row: AuditRow,
    pub chain: String,
    /// None for an entry from before the chains.
    pub chain_seq: Option<i64>,
    pub prev_hash: Option<Vec<u8>>,
}

/// What `audit_chains` records of a chain: where it starts and its newest entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainRecord {
    pub chain: String,
    /// The first kept entry's fleet-wide seq, its place and the hash it carries.
    pub start_seq: i64,
    pub start_chain_seq: i64,
    pub start_prev_hash: Vec<u8>,
    pub head_seq: i64,
    pub head_chain_seq: i64,
    pub head_hash: Vec<u8>,
    /// Entries pruned from its start so far.
    pub pruned: i64,
}

pub fn chain_records(conn: &Connection) -> rusqlite::Result<Vec<ChainRecord>> {
    let mut stmt = conn.prepare_cached(
        "SELECT chain, start_seq, start_chain_seq, start_prev_hash, head_seq, head_chain_seq,
                head_hash, pruned
         FROM audit_chains ORDER BY chain",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(ChainRecord {
            chain: r.get(0)?,
            start_seq: r.get(1)?,
            start_chain_seq: r.get(2)?,
            start_prev_hash: r.get(3)?,
            head_seq: r.get(4)?,
            head_chain_seq: r.get(5)?,
            head_hash: r.get(6)?,
            pruned: r.get(7)?,
        })
    })?;
    rows.collect()
}

/// The chains that hold entries.
pub fn chains(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    strings(
        conn,
        "SELECT DISTINCT chain FROM audit_log INDEXED BY audit_log_chain ORDER BY chain",
        [],
    )
}

/// Hands `chain`'s entries, oldest first, to `each` until it answers false.
pub fn walk(
    conn: &Connection,
    chain: &str,
    each: &mut dyn FnMut(Link) -> bool,
) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS}, chain, chain_seq, prev_hash FROM audit_log INDEXED BY audit_log_chain
         WHERE chain = ?1 ORDER BY seq"
    ))?;
    let mut rows = stmt.query([chain])?;
    while let Some(r) = rows.next()? {
        let link = Link {
            row: from_row(r)?,
            chain: r.get(11)?,
            chain_seq: r.get(12)?,
            prev_hash: r.get(13)?,
        };
        if !each(link) {
            break;
        }
    }
    Ok(())
}

/// The state database at `path`, read-only (for `audit --verify`, also while serve runs).
pub fn open_read_only(path: &std::path::Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    Ok(conn)
}

/// Whether the database has the audit chains (their migration was applied).
pub fn chained(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT COUNT(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'audit_chains'",
        [],
        |r| r.get(0),
    )
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
            by_admin: false,
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
        // Entries before 3 go: "a"'s first and "b"'s first.
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

    #[test]
    fn an_admins_call_on_a_teams_object_is_in_the_teams_view_and_outlives_its_flood() {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("s.db")).unwrap();
        let keep = Retention {
            seconds: KEEP_SECONDS,
            identified_rows: 100,
            tenant_rows: 3,
            unidentified_rows: 100,
        };
        let admin_on_team = AuditRow {
            by_admin: true,
            token_name: "admin".into(),
            method: "gpufleet.v1.GpuQuotaService/UpdateGpuQuota".into(),
            ..entry("team-a", 1)
        };
        record(&conn, &admin_on_team).unwrap();
        let team = list(&conn, Some("team-a"), 0, 10).unwrap();
        assert_eq!(team.len(), 1);
        assert!(
            team[0].by_admin && team[0].tenant_seq == Some(1),
            "{team:?}"
        );
        // The admin's view shows it once, as the admin's entry.
        let all = list(&conn, None, 0, 10).unwrap();
        assert_eq!(all.len(), 1, "{all:?}");
        assert_eq!((all[0].tenant_id.as_str(), all[0].by_admin), ("", true));
        // The team's flood ages its copy out of its own chain, never the admin's entry.
        for at in 2..20 {
            record(&conn, &entry("team-a", at)).unwrap();
            prune_within(&conn, 100, keep).unwrap();
        }
        let team: Vec<i64> = list(&conn, Some("team-a"), 0, 10)
            .unwrap()
            .iter()
            .map(|e| e.tenant_seq.unwrap())
            .collect();
        assert_eq!(team, vec![17, 18, 19], "one run, its sequence never reused");
        let admins: Vec<AuditRow> = list(&conn, None, 0, 100)
            .unwrap()
            .into_iter()
            .filter(|e| e.by_admin)
            .collect();
        assert_eq!(admins.len(), 1);
        assert_eq!(admins[0].method, admin_on_team.method);
    }
}
