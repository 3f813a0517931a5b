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
//!
//! The statements run on SQLite and PostgreSQL (`gpufleet_sql`, issue 41). Every number
//! an entry gets is gap-free and in commit order on both: `chain_seq` and `tenant_seq`
//! count on in rows of their own (`audit_chains`, `audit_tenant_seqs`), and the
//! fleet-wide `seq` is SQLite's AUTOINCREMENT there and numbered by [`append`] itself on
//! PostgreSQL. On PostgreSQL they are written in `gpufleet_sql::Database::write`'s
//! serializable transaction, which fails and runs again the loser of two appends that
//! raced.

use std::borrow::Cow;

use gpufleet_sql::{params, AsConn, Conn, Engine, Row, ToValue};
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
/// On PostgreSQL the transaction must be a serializable write (`Database::write`): its
/// numbers are read and raised in it.
pub fn record(conn: &impl AsConn, e: &AuditRow) -> gpufleet_sql::Result<()> {
    let c = conn.as_conn();
    if is_copy(e) {
        append(
            c,
            &AuditRow {
                tenant_id: String::new(),
                ..e.clone()
            },
        )?;
    }
    append(c, e)
}

/// SQLite numbers `seq` itself: AUTOINCREMENT never reuses one, even once pruned.
const INSERT_SQLITE: &str =
    "INSERT INTO audit_log (tenant_seq, at, tenant_id, by_admin, token_name, token_scope,
         method, object, outcome, message, chain, chain_seq, prev_hash)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) RETURNING seq";

/// PostgreSQL's identity column would number rows as they are inserted, not as they
/// commit, and a rolled-back write would leave a gap: an admin's cursor could pass an
/// entry committed later with a lower seq. So the entry takes the next number in its
/// serializable transaction, which any other append racing it makes fail and run again
/// (each reads what the other writes: the newest seq, `audit_chains`).
///
/// MAX(seq) + 1 alone would reuse numbers: pruning may delete the newest entries, even
/// all of them (by age, or a retention of 0), and a new entry would then take a pruned
/// entry's seq, one an admin's cursor has already passed and a chain's recorded head or
/// start names. The greatest seq ever appended is also its chain's `head_seq` in
/// `audit_chains`, whose rows pruning never deletes; the next seq is past both, so a
/// number is never given twice, as SQLite's AUTOINCREMENT never gives one twice.
const INSERT_POSTGRES: &str =
    "INSERT INTO audit_log (seq, tenant_seq, at, tenant_id, by_admin, token_name, token_scope,
         method, object, outcome, message, chain, chain_seq, prev_hash)
     VALUES (
         (SELECT GREATEST(COALESCE(MAX(seq), 0),
                          (SELECT COALESCE(MAX(head_seq), 0) FROM audit_chains)) + 1
          FROM audit_log),
         ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) RETURNING seq";

fn append(c: Conn<'_>, e: &AuditRow) -> gpufleet_sql::Result<()> {
    let chain = chain_of(e);
    let head: Option<(i64, Vec<u8>)> = c.query_opt(
        "SELECT head_chain_seq, head_hash FROM audit_chains WHERE chain = ?1",
        params![chain],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let (chain_seq, prev) = match &head {
        Some((n, hash)) => (n + 1, hash.clone()),
        None => (1, GENESIS.to_vec()),
    };
    // A tenant's sequence never goes back, whatever was pruned. (The counter is named
    // with its table: PostgreSQL reads a bare `last` as ambiguous with `excluded`'s.)
    let tenant_seq: Option<i64> = if e.tenant_id.is_empty() {
        None
    } else {
        Some(c.query_row(
            "INSERT INTO audit_tenant_seqs (tenant_id, last) VALUES (?1, 1)
             ON CONFLICT (tenant_id) DO UPDATE SET last = audit_tenant_seqs.last + 1
             RETURNING last",
            params![e.tenant_id],
            |r| r.get(0),
        )?)
    };
    let insert = match c.engine() {
        Engine::Sqlite => INSERT_SQLITE,
        Engine::Postgres => INSERT_POSTGRES,
    };
    let seq: i64 = c.query_row(
        insert,
        params![
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
    let hash = entry_hash(&written, chain, chain_seq, &prev).to_vec();
    if head.is_some() {
        c.execute(
            "UPDATE audit_chains SET head_seq = ?2, head_chain_seq = ?3, head_hash = ?4 WHERE chain = ?1",
            params![chain, seq, chain_seq, hash],
        )?;
    } else {
        c.execute(
            "INSERT INTO audit_chains (chain, start_seq, start_chain_seq, start_prev_hash,
                 head_seq, head_chain_seq, head_hash, pruned)
             VALUES (?1, ?2, 1, ?3, ?2, 1, ?4, 0)",
            params![chain, seq, GENESIS.to_vec(), hash],
        )?;
    }
    Ok(())
}

/// `sql` as `c`'s engine takes it. SQLite is told the index to read (`INDEXED BY`, as
/// before the seam); PostgreSQL has no index hints (its planner chooses by the table's
/// statistics), so there the hints are cut.
fn for_engine<'s>(c: Conn<'_>, sql: &'s str) -> Cow<'s, str> {
    match c.engine() {
        Engine::Sqlite => Cow::Borrowed(sql),
        Engine::Postgres => Cow::Owned(without_index_hints(sql)),
    }
}

/// `sql` without its ` INDEXED BY <index>` clauses.
fn without_index_hints(sql: &str) -> String {
    const HINT: &str = " INDEXED BY ";
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(i) = rest.find(HINT) {
        out.push_str(&rest[..i]);
        let index = &rest[i + HINT.len()..];
        let end = index
            .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
            .unwrap_or(index.len());
        rest = &index[end..];
    }
    out.push_str(rest);
    out
}

/// Drops entries older than [`KEEP_SECONDS`], beyond the newest [`KEEP_TENANT_ROWS`] of a
/// tenant's chain, the newest [`KEEP_ROWS`] of callers with a valid token or the newest
/// [`KEEP_UNIDENTIFIED_ROWS`] of those without.
pub fn prune(conn: &impl AsConn, now: i64) -> gpufleet_sql::Result<usize> {
    prune_within(conn, now, RETENTION)
}

/// [`prune`] with the bounds given. Each chain loses a run of its oldest entries only
/// (an entry kept for its age keeps every later one of its chain, even one older by a
/// clock that went back), and its recorded start moves past them.
pub fn prune_within(conn: &impl AsConn, now: i64, keep: Retention) -> gpufleet_sql::Result<usize> {
    let c = conn.as_conn();
    // Per chain: its entries before this fleet-wide seq go.
    let mut cuts: std::collections::BTreeMap<String, i64> = Default::default();
    let mut raise = |chain: String, cut: i64| {
        let c = cuts.entry(chain).or_insert(cut);
        *c = (*c).max(cut);
    };
    let cutoff = now.saturating_sub(keep.seconds);
    for chain in strings(
        c,
        "SELECT DISTINCT chain FROM audit_log INDEXED BY audit_log_at WHERE at < ?1",
        params![cutoff],
    )? {
        // The first entry young enough; none: every entry goes.
        let first_young: Option<i64> = c.query_opt(
            &for_engine(
                c,
                "SELECT seq FROM audit_log INDEXED BY audit_log_chain
                 WHERE chain = ?1 AND at >= ?2 ORDER BY seq LIMIT 1",
            ),
            params![chain, cutoff],
            |r| r.get(0),
        )?;
        raise(chain, first_young.unwrap_or(i64::MAX));
    }
    for chain in strings(
        c,
        "SELECT chain FROM audit_log INDEXED BY audit_log_chain WHERE chain NOT IN ('', '*')
         GROUP BY chain HAVING COUNT(*) > ?1",
        params![keep.tenant_rows],
    )? {
        let oldest_kept = nth_newest(
            c,
            "SELECT seq FROM audit_log INDEXED BY audit_log_chain WHERE chain = ?1
             ORDER BY seq DESC LIMIT 1 OFFSET ?2",
            &chain,
            keep.tenant_rows,
        )?;
        raise(chain, oldest_kept);
    }
    // Of callers with a valid token, fleet-wide: a run of the oldest of each chain.
    let oldest_kept = nth_newest(
        c,
        "SELECT seq FROM audit_log WHERE chain != ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2",
        UNIDENTIFIED_CHAIN,
        keep.identified_rows,
    )?;
    for chain in strings(
        c,
        "SELECT DISTINCT chain FROM audit_log WHERE seq < ?1 AND chain != '*'",
        params![oldest_kept],
    )? {
        raise(chain, oldest_kept);
    }
    let oldest_kept = nth_newest(
        c,
        "SELECT seq FROM audit_log INDEXED BY audit_log_chain WHERE chain = ?1
         ORDER BY seq DESC LIMIT 1 OFFSET ?2",
        UNIDENTIFIED_CHAIN,
        keep.unidentified_rows,
    )?;
    raise(UNIDENTIFIED_CHAIN.into(), oldest_kept);

    let mut pruned = 0;
    for (chain, cut) in cuts {
        let gone = c.execute(
            "DELETE FROM audit_log WHERE chain = ?1 AND seq < ?2",
            params![chain, cut],
        )?;
        if gone > 0 {
            move_start(c, &chain)?;
        }
        pruned += gone;
    }
    Ok(pruned)
}

/// Rows of one text column.
fn strings(c: Conn<'_>, sql: &str, params: &[&dyn ToValue]) -> gpufleet_sql::Result<Vec<String>> {
    c.query_map(&for_engine(c, sql), params, |r| r.get(0))
}

/// The seq of the `n`th newest entry the query finds (`?1`: `arg`, `?2`: the offset);
/// 0 when there are fewer (nothing goes).
fn nth_newest(c: Conn<'_>, sql: &str, arg: &str, n: i64) -> gpufleet_sql::Result<i64> {
    if n < 1 {
        return Ok(i64::MAX);
    }
    Ok(
        c.query_opt(&for_engine(c, sql), params![arg, n - 1], |r| r.get(0))?
            .unwrap_or(0),
    )
}

/// Records that `chain` now starts at its first chained entry left (or, with none left,
/// right after its newest), with the hash that entry carries.
fn move_start(c: Conn<'_>, chain: &str) -> gpufleet_sql::Result<()> {
    let first: Option<(i64, i64, Vec<u8>)> = c.query_opt(
        &for_engine(
            c,
            "SELECT seq, chain_seq, prev_hash FROM audit_log INDEXED BY audit_log_chain
             WHERE chain = ?1 AND chain_seq IS NOT NULL ORDER BY seq LIMIT 1",
        ),
        params![chain],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    match first {
        Some((seq, chain_seq, prev)) => c.execute(
            "UPDATE audit_chains SET pruned = pruned + (?3 - start_chain_seq),
                 start_seq = ?2, start_chain_seq = ?3, start_prev_hash = ?4
             WHERE chain = ?1 AND start_chain_seq < ?3",
            params![chain, seq, chain_seq, prev],
        )?,
        // None left: the next entry starts it, after the recorded newest.
        None => c.execute(
            "UPDATE audit_chains SET pruned = pruned + (head_chain_seq + 1 - start_chain_seq),
                 start_seq = head_seq + 1, start_chain_seq = head_chain_seq + 1,
                 start_prev_hash = head_hash
             WHERE chain = ?1 AND start_chain_seq <= head_chain_seq",
            params![chain],
        )?,
    };
    Ok(())
}

fn from_row(r: &Row) -> gpufleet_sql::Result<AuditRow> {
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
    conn: &impl AsConn,
    tenant: Option<&str>,
    after: i64,
    limit: i64,
) -> gpufleet_sql::Result<Vec<AuditRow>> {
    // `?2` is typed where it stands alone (PostgreSQL infers no type for it), and the
    // flag compared with 1 (a BIGINT on PostgreSQL, not a boolean).
    let sql = match tenant {
        // Teams' copies of the admin's entries are not shown twice.
        None => format!("SELECT {COLUMNS} FROM audit_log WHERE seq > ?1 AND CAST(?2 AS TEXT) IS NULL AND NOT (by_admin = 1 AND tenant_id != '') ORDER BY seq LIMIT ?3"),
        Some(_) => format!(
            "SELECT {COLUMNS} FROM audit_log WHERE tenant_id = ?2 AND tenant_seq > ?1 ORDER BY tenant_seq LIMIT ?3"
        ),
    };
    conn.as_conn()
        .query_map(&sql, params![after, tenant, limit], from_row)
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

/// Every chain's record, by chain (bytewise: PostgreSQL's ORDER BY follows the
/// database's collation).
pub fn chain_records(conn: &impl AsConn) -> gpufleet_sql::Result<Vec<ChainRecord>> {
    let mut records = conn.as_conn().query_map(
        "SELECT chain, start_seq, start_chain_seq, start_prev_hash, head_seq, head_chain_seq,
                head_hash, pruned
         FROM audit_chains ORDER BY chain",
        params![],
        |r| {
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
        },
    )?;
    records.sort_by(|a, b| a.chain.cmp(&b.chain));
    Ok(records)
}

/// The chains that hold entries, bytewise in order.
pub fn chains(conn: &impl AsConn) -> gpufleet_sql::Result<Vec<String>> {
    let mut chains = strings(
        conn.as_conn(),
        "SELECT DISTINCT chain FROM audit_log INDEXED BY audit_log_chain ORDER BY chain",
        params![],
    )?;
    chains.sort();
    Ok(chains)
}

/// How many entries [`walk`] reads at a time: a chain may hold hundreds of thousands.
const WALK_PAGE: i64 = 1000;

/// Hands `chain`'s entries, oldest first, to `each` until it answers false. A page at a
/// time: call it inside one transaction (a read's snapshot) to see the chain as of one
/// moment.
pub fn walk(
    conn: &impl AsConn,
    chain: &str,
    each: &mut dyn FnMut(Link) -> bool,
) -> gpufleet_sql::Result<()> {
    walk_in_pages(conn.as_conn(), chain, WALK_PAGE, each)
}

fn walk_in_pages(
    c: Conn<'_>,
    chain: &str,
    page: i64,
    each: &mut dyn FnMut(Link) -> bool,
) -> gpufleet_sql::Result<()> {
    let sql = format!(
        "SELECT {COLUMNS}, chain, chain_seq, prev_hash FROM audit_log INDEXED BY audit_log_chain
         WHERE chain = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3"
    );
    let sql = for_engine(c, &sql);
    let mut after = i64::MIN;
    loop {
        let links = c.query_map(&sql, params![chain, after, page], |r| {
            Ok(Link {
                row: from_row(r)?,
                chain: r.get(11)?,
                chain_seq: r.get(12)?,
                prev_hash: r.get(13)?,
            })
        })?;
        let full = links.len() as i64 >= page;
        for link in links {
            after = link.row.seq;
            if !each(link) {
                return Ok(());
            }
        }
        if !full {
            return Ok(());
        }
    }
}

/// The SQLite state database at `path`, read-only (for `audit --verify`, also while
/// serve runs). SQLite's alone: it opens the store's file.
pub fn open_read_only(path: &std::path::Path) -> rusqlite::Result<rusqlite::Connection> {
    let conn = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    Ok(conn)
}

/// Whether the database has the audit chains (their migration was applied). Each
/// engine lists its tables in its own catalog.
pub fn chained(conn: &impl AsConn) -> gpufleet_sql::Result<bool> {
    let c = conn.as_conn();
    let sql = match c.engine() {
        Engine::Sqlite => {
            "SELECT COUNT(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'audit_chains'"
        }
        Engine::Postgres => {
            "SELECT COUNT(*) > 0 FROM information_schema.tables
             WHERE table_schema = current_schema() AND table_name = 'audit_chains'"
        }
    };
    c.query_row(sql, params![], |r| r.get(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::engines::{self, on_both};
    use gpufleet_sql::Database;

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

    fn rec(db: &mut Database, e: &AuditRow) {
        db.write(|c| record(c, e)).unwrap();
    }

    fn listed(db: &mut Database, tenant: Option<&str>, after: i64, limit: i64) -> Vec<AuditRow> {
        db.read(|c| list(c, tenant, after, limit)).unwrap()
    }

    fn pruned(db: &mut Database, now: i64, keep: Retention) -> usize {
        db.write(|c| prune_within(c, now, keep)).unwrap()
    }

    /// Every chain's entries follow its record: consecutive places from its start, each
    /// carrying the hash of the one before, the newest the recorded head (what `audit
    /// --verify` checks, on either engine).
    fn assert_chains_whole(db: &mut Database) {
        db.read(|c| {
            for r in chain_records(c)? {
                let mut last: Option<(i64, Vec<u8>)> = None;
                let mut entries = 0;
                walk(c, &r.chain, &mut |l| {
                    let (place, prev) = match &last {
                        Some((p, h)) => (p + 1, h.clone()),
                        None => (r.start_chain_seq, r.start_prev_hash.clone()),
                    };
                    assert_eq!(l.chain_seq, Some(place), "{:?}", l.row);
                    assert_eq!(l.prev_hash.as_deref(), Some(prev.as_slice()), "{:?}", l.row);
                    let hash = entry_hash(&l.row, &l.chain, place, &prev);
                    last = Some((place, hash.to_vec()));
                    entries += 1;
                    true
                })?;
                match last {
                    Some((place, hash)) => {
                        assert_eq!((place, hash), (r.head_chain_seq, r.head_hash.clone()))
                    }
                    // Pruned whole: the next entry starts it.
                    None => assert_eq!(
                        (r.start_chain_seq, &r.start_prev_hash),
                        (r.head_chain_seq + 1, &r.head_hash)
                    ),
                }
                assert_eq!(r.pruned + entries, r.head_chain_seq, "{r:?}");
            }
            Ok(())
        })
        .unwrap();
    }

    #[test]
    fn each_tenant_counts_its_own() {
        on_both(|db| {
            for (t, at) in [("a", 1), ("b", 2), ("b", 3), ("", 4), ("a", 5)] {
                rec(db, &entry(t, at));
            }
            let a: Vec<_> = listed(db, Some("a"), 0, 10)
                .into_iter()
                .map(|e| (e.tenant_seq, e.at))
                .collect();
            assert_eq!(a, vec![(Some(1), 1), (Some(2), 5)]);
            assert_eq!(listed(db, Some("b"), 1, 10)[0].at, 3);
            assert_eq!(listed(db, None, 0, 10).len(), 5);
            assert_eq!(listed(db, None, 3, 10)[0].tenant_id, "");
            // Entries before 3 go: "a"'s first and "b"'s first.
            assert_eq!(db.write(|c| prune(c, 3 + KEEP_SECONDS)).unwrap(), 2);
            rec(db, &entry("b", 6));
            assert_eq!(listed(db, Some("b"), 2, 10)[0].tenant_seq, Some(3));
            assert_chains_whole(db);
        });
    }

    #[test]
    fn a_flood_of_refusals_without_a_token_never_pushes_out_a_teams_entries() {
        on_both(|db| {
            let keep = Retention {
                seconds: KEEP_SECONDS,
                identified_rows: 5,
                tenant_rows: 5,
                unidentified_rows: 3,
            };
            for at in 1..=4 {
                rec(db, &entry("team-a", at));
            }
            let stranger = AuditRow {
                token_name: String::new(),
                token_scope: String::new(),
                outcome: "UNAUTHENTICATED".into(),
                ..entry("", 0)
            };
            for at in 10..110 {
                rec(
                    db,
                    &AuditRow {
                        at,
                        ..stranger.clone()
                    },
                );
                pruned(db, 200, keep);
            }
            let all = listed(db, None, 0, 1000);
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
                rec(db, &entry("team-a", at));
            }
            pruned(db, 300, keep);
            let team: Vec<i64> = listed(db, Some("team-a"), 0, 100)
                .iter()
                .map(|e| e.at)
                .collect();
            assert_eq!(team, vec![3, 4, 200, 201, 202]);
            assert_chains_whole(db);
        });
    }

    #[test]
    fn a_team_flooding_with_its_own_token_ages_out_only_its_own_entries() {
        on_both(|db| {
            let keep = Retention {
                seconds: KEEP_SECONDS,
                identified_rows: 100,
                tenant_rows: 4,
                unidentified_rows: 100,
            };
            for at in 1..=3 {
                rec(db, &entry("quiet", at));
                rec(db, &entry("", at));
            }
            for at in 10..60 {
                rec(db, &entry("noisy", at));
                pruned(db, 100, keep);
            }
            let mut ats = |t: Option<&str>| -> Vec<i64> {
                listed(db, t, 0, 1000)
                    .iter()
                    .filter(|e| t.is_some() || e.tenant_id.is_empty())
                    .map(|e| e.at)
                    .collect()
            };
            assert_eq!(ats(Some("noisy")), vec![56, 57, 58, 59]);
            assert_eq!(ats(Some("quiet")), vec![1, 2, 3]);
            assert_eq!(ats(None), vec![1, 2, 3], "the admin's entries stay");
            // Its sequence goes on from its newest.
            rec(db, &entry("noisy", 60));
            assert_eq!(
                listed(db, Some("noisy"), 0, 10).last().unwrap().tenant_seq,
                Some(51)
            );
            assert_chains_whole(db);
        });
    }

    #[test]
    fn an_admins_call_on_a_teams_object_is_in_the_teams_view_and_outlives_its_flood() {
        on_both(|db| {
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
            rec(db, &admin_on_team);
            let team = listed(db, Some("team-a"), 0, 10);
            assert_eq!(team.len(), 1);
            assert!(
                team[0].by_admin && team[0].tenant_seq == Some(1),
                "{team:?}"
            );
            // The admin's view shows it once, as the admin's entry.
            let all = listed(db, None, 0, 10);
            assert_eq!(all.len(), 1, "{all:?}");
            assert_eq!((all[0].tenant_id.as_str(), all[0].by_admin), ("", true));
            // The team's flood ages its copy out of its own chain, never the admin's entry.
            for at in 2..20 {
                rec(db, &entry("team-a", at));
                pruned(db, 100, keep);
            }
            let team: Vec<i64> = listed(db, Some("team-a"), 0, 10)
                .iter()
                .map(|e| e.tenant_seq.unwrap())
                .collect();
            assert_eq!(team, vec![17, 18, 19], "one run, its sequence never reused");
            let admins: Vec<AuditRow> = listed(db, None, 0, 100)
                .into_iter()
                .filter(|e| e.by_admin)
                .collect();
            assert_eq!(admins.len(), 1);
            assert_eq!(admins[0].method, admin_on_team.method);
            assert_chains_whole(db);
        });
    }

    /// Pruning may delete the newest entries, even all of them; a number is never given
    /// twice all the same (SQLite's AUTOINCREMENT; PostgreSQL's numbering reads past the
    /// chains' recorded heads), so an admin's cursor past the pruned entries still sees
    /// the next one.
    #[test]
    fn a_pruned_entrys_numbers_are_never_given_again() {
        on_both(|db| {
            for (t, at) in [("team-a", 1), ("", 2), ("team-a", 3), ("", 4)] {
                rec(db, &entry(t, at));
            }
            let newest = listed(db, None, 0, 10).last().unwrap().seq;
            assert_eq!(newest, 4);
            // All of them age out.
            assert_eq!(db.write(|c| prune(c, 100 + KEEP_SECONDS)).unwrap(), 4);
            assert!(listed(db, None, 0, 10).is_empty());
            assert_chains_whole(db);
            rec(db, &entry("team-a", 200));
            rec(db, &entry("", 201));
            let after: Vec<(i64, Option<i64>)> = listed(db, None, newest, 10)
                .iter()
                .map(|e| (e.seq, e.tenant_seq))
                .collect();
            assert_eq!(after, vec![(5, Some(3)), (6, None)]);
            let records = db.read(|c| chain_records(c)).unwrap();
            let places: Vec<(&str, i64, i64, i64)> = records
                .iter()
                .map(|r| {
                    (
                        r.chain.as_str(),
                        r.start_chain_seq,
                        r.head_chain_seq,
                        r.pruned,
                    )
                })
                .collect();
            assert_eq!(places, vec![("", 3, 3, 2), ("team-a", 3, 3, 2)]);
            assert_chains_whole(db);
            // A retention of 0 empties the strangers' chain at every prune: it too goes on.
            let stranger = AuditRow {
                token_name: String::new(),
                ..entry("", 300)
            };
            let keep = Retention {
                unidentified_rows: 0,
                ..RETENTION
            };
            let mut seqs = Vec::new();
            for _ in 0..3 {
                rec(db, &stranger);
                seqs.push(listed(db, None, 0, 10).last().unwrap().seq);
                assert_eq!(pruned(db, 300, keep), 1);
            }
            assert_eq!(seqs, vec![7, 8, 9]);
            assert_chains_whole(db);
        });
    }

    #[test]
    fn a_walk_reads_a_chain_in_pages_and_stops_when_told() {
        on_both(|db| {
            for at in 1..=7 {
                rec(db, &entry("team-a", at));
                rec(db, &entry("", at));
            }
            let ats = |db: &mut Database, page: i64, stop_after: usize| -> Vec<i64> {
                db.read(|c| {
                    let mut seen = Vec::new();
                    walk_in_pages(c.as_conn(), "team-a", page, &mut |l| {
                        seen.push(l.row.at);
                        seen.len() < stop_after
                    })?;
                    Ok(seen)
                })
                .unwrap()
            };
            let all: Vec<i64> = (1..=7).collect();
            for page in [1, 3, 7, 1000] {
                assert_eq!(ats(db, page, usize::MAX), all, "pages of {page}");
            }
            assert_eq!(ats(db, 3, 4), vec![1, 2, 3, 4]);
            assert_eq!(ats(db, 2, 2), vec![1, 2]);
            assert_eq!(
                db.read(|c| chains(c)).unwrap(),
                vec!["".to_string(), "team-a".to_string()]
            );
            assert!(db.read(|c| chained(c)).unwrap());
        });
    }

    #[test]
    fn index_hints_are_cut_for_postgres_only() {
        let sql = "SELECT seq FROM audit_log INDEXED BY audit_log_chain\n WHERE chain = ?1";
        assert_eq!(
            without_index_hints(sql),
            "SELECT seq FROM audit_log\n WHERE chain = ?1"
        );
        assert_eq!(
            without_index_hints(
                "SELECT a FROM t INDEXED BY t_a WHERE a IN (SELECT b FROM u INDEXED BY u_b)"
            ),
            "SELECT a FROM t WHERE a IN (SELECT b FROM u)"
        );
        assert_eq!(without_index_hints("SELECT 1"), "SELECT 1");
    }

    /// Replicas append to one PostgreSQL database at once, each its own connection, while
    /// an admin and a team follow the log by their cursors. Every number stays gap-free
    /// and in commit order: the seqs are 1..N, each tenant's and each chain's places
    /// count up by one in seq order, every chain's hashes link, and the cursors, read
    /// while the appends raced, missed nothing (an entry committed after a later-numbered
    /// one would be skipped by a cursor that had passed it).
    #[test]
    fn replicas_appending_at_once_on_postgres_keep_every_sequence_whole() {
        const REPLICAS: usize = 4;
        const APPENDS: i64 = 40;
        let (_guard, mut db, url) = engines::postgres();
        let done = std::sync::atomic::AtomicBool::new(false);
        let start = std::sync::Barrier::new(REPLICAS + 1);
        let (admin_seen, team_seen) = std::thread::scope(|s| {
            let writers: Vec<_> = (0..REPLICAS)
                .map(|r| {
                    let url = url.clone();
                    let start = &start;
                    s.spawn(move || {
                        let mut db = Database::postgres(&url).unwrap();
                        start.wait();
                        for i in 0..APPENDS {
                            let at = i * REPLICAS as i64 + r as i64;
                            let e = match (r + i as usize) % 4 {
                                0 => entry("team-a", at),
                                1 => entry(&format!("team-{r}"), at),
                                2 => entry("", at),
                                _ => AuditRow {
                                    by_admin: true,
                                    token_name: "admin".into(),
                                    ..entry("team-a", at)
                                },
                            };
                            rec(&mut db, &e);
                        }
                    })
                })
                .collect();
            let reader = s.spawn(|| {
                let mut db = Database::postgres(&url).unwrap();
                let (mut admin, mut team) = (Vec::<AuditRow>::new(), Vec::<AuditRow>::new());
                start.wait();
                loop {
                    let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                    let after = admin.last().map_or(0, |e| e.seq);
                    let more = listed(&mut db, None, after, 7);
                    let team_after = team.last().map_or(0, |e| e.tenant_seq.unwrap());
                    let team_more = listed(&mut db, Some("team-a"), team_after, 7);
                    let idle = more.is_empty() && team_more.is_empty();
                    admin.extend(more);
                    team.extend(team_more);
                    if finished && idle {
                        return (admin, team);
                    }
                }
            });
            // The reader stops even when a writer failed, so that the failure is told
            // rather than waited on for ever.
            let written: Vec<_> = writers.into_iter().map(|w| w.join()).collect();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            let seen = reader.join().unwrap();
            for w in written {
                w.unwrap();
            }
            seen
        });
        let copies = (0..REPLICAS as i64)
            .flat_map(|r| (0..APPENDS).map(move |i| (r + i) % 4 == 3))
            .filter(|c| *c)
            .count() as i64;
        let total = REPLICAS as i64 * APPENDS + copies;
        let rows: Vec<(i64, Option<i64>, String, Option<i64>)> = db
            .read(|c| {
                c.query_map(
                    "SELECT seq, tenant_seq, chain, chain_seq FROM audit_log ORDER BY seq",
                    params![],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                )
            })
            .unwrap();
        let seqs: Vec<i64> = rows.iter().map(|r| r.0).collect();
        assert_eq!(seqs, (1..=total).collect::<Vec<_>>(), "seq has a gap");
        let mut tenant_last = std::collections::BTreeMap::<String, i64>::new();
        let mut chain_last = std::collections::BTreeMap::<String, i64>::new();
        for (seq, tenant_seq, chain, chain_seq) in &rows {
            let place = chain_last.entry(chain.clone()).or_insert(0);
            *place += 1;
            assert_eq!(chain_seq, &Some(*place), "entry {seq} of chain {chain:?}");
            // A tenant's entries are its chain's, so its sequence is the chain's place.
            if !chain.is_empty() {
                let n = tenant_last.entry(chain.clone()).or_insert(0);
                *n += 1;
                assert_eq!(tenant_seq, &Some(*n), "entry {seq} of tenant {chain}");
            }
        }
        assert_chains_whole(&mut db);
        let admin_all = listed(&mut db, None, 0, 10_000);
        assert_eq!(admin_seen, admin_all, "the admin's cursor missed entries");
        let team_all = listed(&mut db, Some("team-a"), 0, 10_000);
        assert_eq!(team_seen, team_all, "the team's cursor missed entries");
        eprintln!(
            "{total} entries; the admin's cursor read {}, the team's {}",
            admin_seen.len(),
            team_seen.len()
        );
    }
}
