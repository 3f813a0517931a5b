//! `gpufleet-agent audit --verify`: walks every chain of the audit log (`store::audit`)
//! and names where one is broken: an entry whose contents no longer match the hash the
//! next one carries of it (edited), places missing from a chain (deleted: between two
//! entries, before its recorded start or after its recorded newest), an unchained entry
//! after a chain began, entries of a chain nobody recorded.
//!
//! The hashes are not keyed: whoever can write the database can also rewrite a whole
//! chain. Each chain's newest hash, copied elsewhere, is what makes a rewrite show.

use gpufleet_sql::AsConn;

use crate::store::audit::{self, ChainRecord, Link};

/// Where a chain is broken; `seq` is the fleet-wide seq of the first entry concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    pub seq: i64,
    pub why: String,
}

/// One whole chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Whole {
    pub chain: String,
    pub entries: u64,
    /// Of `entries`, the team's copies of the admin's calls on its objects: the admin's
    /// listing shows each such call once, so the chains hold more entries than it lists.
    pub copies: u64,
    /// Entries from before the chains, ahead of it (not verified).
    pub unchained: u64,
    pub record: Option<ChainRecord>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verified {
    pub whole: Vec<Whole>,
    /// The first break of each broken chain, the lowest seq first.
    pub broken: Vec<Broken>,
}

/// A chain's short name, for a table.
pub fn label(chain: &str) -> String {
    match chain {
        audit::ADMIN_CHAIN => "admin".into(),
        audit::UNIDENTIFIED_CHAIN => "no valid token".into(),
        tenant => format!("tenant {tenant}"),
    }
}

/// How a message names a chain.
pub fn name(chain: &str) -> String {
    match chain {
        audit::ADMIN_CHAIN => "the admin's chain".into(),
        audit::UNIDENTIFIED_CHAIN => "the chain of callers without a valid token".into(),
        tenant => format!("tenant {tenant}'s chain"),
    }
}

/// Walks every chain inside one read transaction of `conn` (a consistent snapshot while
/// serve writes): on SQLite a savepoint of its own is that transaction (or nests in the
/// caller's); on PostgreSQL `conn` must be in a transaction already (`Database::read`'s
/// snapshot). Nothing is written: the savepoint is rolled back. Blocking.
pub fn verify(conn: &impl AsConn) -> gpufleet_sql::Result<Verified> {
    let tx = gpufleet_sql::Savepoint::begin(conn.as_conn())?;
    let records = audit::chain_records(&tx)?;
    let mut chains = audit::chains(&tx)?;
    chains.extend(records.iter().map(|r| r.chain.clone()));
    chains.sort();
    chains.dedup();
    let mut out = Verified::default();
    for chain in chains {
        let record = records.iter().find(|r| r.chain == chain).cloned();
        let mut walk = Walk::new(&chain, record.clone());
        audit::walk(&tx, &chain, &mut |link| walk.step(link))?;
        match walk.finish() {
            Ok((entries, copies, unchained)) => out.whole.push(Whole {
                chain,
                entries,
                copies,
                unchained,
                record,
            }),
            Err(b) => out.broken.push(b),
        }
    }
    out.broken.sort_by_key(|b| b.seq);
    Ok(out)
}

/// One chain's walk, entry by entry.
struct Walk {
    chain: String,
    record: Option<ChainRecord>,
    /// The last chained entry seen, its place and hash.
    last: Option<(i64, i64, [u8; 32])>,
    entries: u64,
    copies: u64,
    unchained: u64,
    broken: Option<Broken>,
}

impl Walk {
    fn new(chain: &str, record: Option<ChainRecord>) -> Self {
        Walk {
            chain: chain.to_string(),
            record,
            last: None,
            entries: 0,
            copies: 0,
            unchained: 0,
            broken: None,
        }
    }

    fn name(&self) -> String {
        name(&self.chain)
    }

    /// Takes the next entry; false once broken.
    fn step(&mut self, link: Link) -> bool {
        self.broken = self.check(&link).err();
        self.broken.is_none()
    }

    fn check(&mut self, link: &Link) -> Result<(), Broken> {
        let seq = link.row.seq;
        let broken = |why: String| Broken { seq, why };
        if audit::chain_of(&link.row) != link.chain {
            return Err(broken(format!(
                "entry {seq} is filed under {} but its fields say {}: it was edited",
                self.name(),
                name(audit::chain_of(&link.row))
            )));
        }
        let (Some(place), Some(prev)) = (link.chain_seq, link.prev_hash.as_deref()) else {
            if let Some((last, _, _)) = self.last {
                return Err(broken(format!(
                    "entry {seq} carries no hash, yet comes after entry {last} of {}: it was edited",
                    self.name()
                )));
            }
            self.unchained += 1;
            return Ok(());
        };
        let Some(record) = &self.record else {
            return Err(broken(format!(
                "entry {seq} is of {}, of which nothing is recorded (audit_chains): the record was deleted",
                self.name()
            )));
        };
        let (want_place, want_prev) = match self.last {
            Some((_, p, h)) => (p + 1, h.to_vec()),
            None => (record.start_chain_seq, record.start_prev_hash.clone()),
        };
        if place > want_place {
            return Err(broken(match self.last {
                Some((last, _, _)) => format!(
                    "entries #{want_place}..#{} of {} are missing between entry {last} and entry {seq}: deleted",
                    place - 1,
                    self.name()
                ),
                None => format!(
                    "entries #{want_place}..#{} of {} are missing before entry {seq} (its first kept entry is #{want_place}): deleted",
                    place - 1,
                    self.name()
                ),
            }));
        }
        if place < want_place {
            return Err(broken(format!(
                "entry {seq} claims place #{place} of {}, where #{want_place} was due: it was edited",
                self.name()
            )));
        }
        if prev != want_prev.as_slice() {
            return Err(match self.last {
                Some((last, _, _)) => Broken {
                    seq: last,
                    why: format!(
                        "entry {last} of {} does not match the hash entry {seq} carries of it: one of them was edited",
                        self.name()
                    ),
                },
                None => broken(format!(
                    "entry {seq}, the first kept of {}, does not carry the hash recorded for its start: it was edited",
                    self.name()
                )),
            });
        }
        let hash = audit::entry_hash(&link.row, &link.chain, place, prev);
        self.last = Some((seq, place, hash));
        self.entries += 1;
        self.copies += u64::from(audit::is_copy(&link.row));
        Ok(())
    }

    /// The chain's entries, its copies of the admin's and unchained ones, or its first
    /// break.
    fn finish(self) -> Result<(u64, u64, u64), Broken> {
        if let Some(b) = self.broken {
            return Err(b);
        }
        let Some(record) = &self.record else {
            return Ok((self.entries, self.copies, self.unchained));
        };
        let name = name(&self.chain);
        match self.last {
            None if record.start_chain_seq <= record.head_chain_seq => Err(Broken {
                seq: record.start_seq,
                why: format!(
                    "entries #{}..#{} of {name} (up to entry {}) are all missing: deleted",
                    record.start_chain_seq, record.head_chain_seq, record.head_seq
                ),
            }),
            None if record.start_prev_hash != record.head_hash => Err(Broken {
                seq: record.head_seq,
                why: format!(
                    "{name} was pruned whole, but its recorded start does not follow its newest: the record was edited"
                ),
            }),
            None => Ok((0, 0, self.unchained)),
            Some((last, place, _)) if place < record.head_chain_seq => Err(Broken {
                seq: last,
                why: format!(
                    "entries #{}..#{} of {name}, after entry {last}, are missing (its newest was entry {}): deleted",
                    place + 1,
                    record.head_chain_seq,
                    record.head_seq
                ),
            }),
            Some((last, place, hash))
                if place > record.head_chain_seq || hash.as_slice() != record.head_hash =>
            {
                Err(Broken {
                    seq: last,
                    why: format!(
                        "entry {last}, the newest of {name}, does not match the hash recorded for it: it was edited"
                    ),
                })
            }
            Some(_) => Ok((self.entries, self.copies, self.unchained)),
        }
    }
}

/// A hash as the CLI prints it.
pub fn hex(hash: &[u8]) -> String {
    hex::encode(hash)
}

/// [`verify`] on the state database at `path`, opened read-only (serve may be running).
/// Blocking.
pub fn verify_file(path: &std::path::Path) -> anyhow::Result<Verified> {
    let conn = audit::open_read_only(path)
        .map_err(|e| anyhow::anyhow!("cannot read the audit log in {}: {e}", path.display()))?;
    if !audit::chained(&conn)? {
        anyhow::bail!(
            "{} predates the audit chains: start this release's serve on it once, then verify",
            path.display()
        );
    }
    Ok(verify(&conn)?)
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    use super::*;
    use crate::store::audit::{prune_within, record, AuditRow, Retention, RETENTION};

    fn entry(tenant: &str, token: &str, at: i64) -> AuditRow {
        AuditRow {
            seq: 0,
            tenant_seq: None,
            at,
            tenant_id: tenant.into(),
            by_admin: tenant.is_empty() && !token.is_empty(),
            token_name: token.into(),
            token_scope: "write".into(),
            method: "gpufleet.v1.TenantService/UpdateTenant".into(),
            object: format!("object-{at}"),
            outcome: "OK".into(),
            message: String::new(),
        }
    }

    /// A store with 3 chains: team-a's (at 1, 4, 7, ...), the admin's and strangers'.
    fn filled() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("s.db")).unwrap();
        for at in 1..=12 {
            let e = match at % 3 {
                1 => entry("team-a", "default", at),
                2 => entry("", "admin", at),
                _ => entry("", "", at),
            };
            record(&conn, &e).unwrap();
        }
        (dir, conn)
    }

    fn first_break(conn: &Connection) -> Broken {
        let v = verify(conn).unwrap();
        v.broken
            .first()
            .cloned()
            .unwrap_or_else(|| panic!("whole: {v:?}"))
    }

    #[test]
    fn an_untouched_log_is_whole_and_each_chain_counted() {
        let (_dir, conn) = filled();
        let v = verify(&conn).unwrap();
        assert!(v.broken.is_empty(), "{v:?}");
        let counts: Vec<(&str, u64)> = v
            .whole
            .iter()
            .map(|w| (w.chain.as_str(), w.entries))
            .collect();
        assert_eq!(counts, vec![("", 4), ("*", 4), ("team-a", 4)]);
    }

    #[test]
    fn an_edited_entry_is_named() {
        let (_dir, conn) = filled();
        // Entry 4 is team-a's second; the third (7) carries its hash.
        conn.execute(
            "UPDATE audit_log SET outcome = 'PERMISSION_DENIED' WHERE seq = 4",
            [],
        )
        .unwrap();
        let b = first_break(&conn);
        assert_eq!(b.seq, 4, "{b:?}");
        assert!(
            b.why.contains(
                "entry 4 of tenant team-a's chain does not match the hash entry 7 carries"
            ),
            "{b:?}"
        );
        // The newest, edited, is named against the recorded newest hash.
        let (_dir, conn) = filled();
        conn.execute("UPDATE audit_log SET message = 'x' WHERE seq = 12", [])
            .unwrap();
        let b = first_break(&conn);
        assert_eq!(b.seq, 12);
        assert!(
            b.why
                .contains("the newest of the chain of callers without a valid token"),
            "{b:?}"
        );
    }

    #[test]
    fn a_deleted_entry_is_named_as_a_gap() {
        let (_dir, conn) = filled();
        conn.execute("DELETE FROM audit_log WHERE seq = 5", [])
            .unwrap();
        let b = first_break(&conn);
        assert_eq!(b.seq, 8, "{b:?}");
        assert!(
            b.why.contains(
                "entries #2..#2 of the admin's chain are missing between entry 2 and entry 8"
            ),
            "{b:?}"
        );
        // The first and the newest of a chain, too.
        let (_dir, conn) = filled();
        conn.execute("DELETE FROM audit_log WHERE seq IN (1, 10)", [])
            .unwrap();
        let v = verify(&conn).unwrap();
        let team = &v.broken[0];
        assert!(
            team.why
                .contains("entries #1..#1 of tenant team-a's chain are missing before entry 4"),
            "{v:?}"
        );
        let (_dir, conn) = filled();
        conn.execute("DELETE FROM audit_log WHERE seq = 10", [])
            .unwrap();
        let b = first_break(&conn);
        assert_eq!(b.seq, 7);
        assert!(
            b.why
                .contains("entries #4..#4 of tenant team-a's chain, after entry 7, are missing"),
            "{b:?}"
        );
        // Moving an entry to another chain is an edit.
        let (_dir, conn) = filled();
        conn.execute("UPDATE audit_log SET chain = '' WHERE seq = 3", [])
            .unwrap();
        let b = first_break(&conn);
        assert!(
            b.why.contains("entry 3 is filed under the admin's chain"),
            "{b:?}"
        );
    }

    #[test]
    fn pruning_moves_each_chains_start_and_keeps_it_verifiable() {
        let (_dir, conn) = filled();
        let keep = Retention {
            seconds: 100,
            identified_rows: 5,
            tenant_rows: 3,
            unidentified_rows: 2,
        };
        // Age: entries before 5 go (at 1..4).
        let pruned = prune_within(&conn, 105, keep).unwrap();
        let v = verify(&conn).unwrap();
        assert!(v.broken.is_empty(), "{v:?}");
        let left: i64 = conn
            .query_row("SELECT COUNT(*) FROM audit_log", [], |r| r.get(0))
            .unwrap();
        assert_eq!(pruned as i64 + left, 12);
        // Strangers keep 2 (9, 12); identified keep 5 (5, 7, 8, 10, 11); team-a at most 3.
        let seqs: Vec<i64> = conn
            .prepare("SELECT seq FROM audit_log ORDER BY seq")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(seqs, vec![5, 7, 8, 9, 10, 11, 12]);
        let team = v.whole.iter().find(|w| w.chain == "team-a").unwrap();
        let r = team.record.as_ref().unwrap();
        assert_eq!((r.start_seq, r.start_chain_seq, r.pruned), (7, 3, 2));
        // Past every entry's age: the chains are empty, recorded, and go on whole.
        prune_within(&conn, 1000, keep).unwrap();
        let left: i64 = conn
            .query_row("SELECT COUNT(*) FROM audit_log", [], |r| r.get(0))
            .unwrap();
        assert_eq!(left, 0);
        assert!(verify(&conn).unwrap().broken.is_empty());
        record(&conn, &entry("team-a", "default", 1001)).unwrap();
        let v = verify(&conn).unwrap();
        assert!(v.broken.is_empty(), "{v:?}");
        let team = v.whole.iter().find(|w| w.chain == "team-a").unwrap();
        assert_eq!(team.entries, 1);
        assert_eq!(team.record.as_ref().unwrap().start_chain_seq, 5);
        // A deleted chain record is named.
        conn.execute("DELETE FROM audit_chains WHERE chain = 'team-a'", [])
            .unwrap();
        assert!(first_break(&conn)
            .why
            .contains("of which nothing is recorded"));
        let _ = RETENTION;
    }

    #[test]
    fn entries_from_before_the_chains_are_kept_ahead_and_counted_apart() {
        let (_dir, conn) = filled();
        // As the migration leaves entries of an older release: no place, no hash.
        conn.execute(
            "INSERT INTO audit_log (seq, tenant_seq, at, tenant_id, token_name, token_scope, method, object, outcome, message, chain)
             VALUES (0, NULL, 0, '', 'admin', 'write', 'm', 'o', 'OK', '', '')",
            [],
        )
        .unwrap();
        let v = verify(&conn).unwrap();
        assert!(v.broken.is_empty(), "{v:?}");
        assert_eq!(v.whole[0].unchained, 1);
        // One with its hash removed after the chain began is an edit.
        conn.execute(
            "UPDATE audit_log SET prev_hash = NULL, chain_seq = NULL WHERE seq = 5",
            [],
        )
        .unwrap();
        let b = first_break(&conn);
        assert!(
            b.why
                .contains("entry 5 carries no hash, yet comes after entry 2"),
            "{b:?}"
        );
    }

    /// The same walk on either engine, in the snapshot of `Database::read`; an edit is
    /// named alike on both.
    #[test]
    fn chains_verify_alike_on_either_engine() {
        for (_guard, mut db) in crate::store::postgres::engines::both() {
            let engine = db.engine();
            db.write(|c| {
                for at in 1..=12 {
                    let e = match at % 3 {
                        1 => entry("team-a", "default", at),
                        2 => entry("", "admin", at),
                        _ => entry("", "", at),
                    };
                    record(c, &e)?;
                }
                Ok(())
            })
            .unwrap();
            let v = db.read(|c| verify(c)).unwrap();
            assert!(v.broken.is_empty(), "{engine:?}: {v:?}");
            let counts: Vec<(&str, u64)> = v
                .whole
                .iter()
                .map(|w| (w.chain.as_str(), w.entries))
                .collect();
            assert_eq!(counts, vec![("", 4), ("*", 4), ("team-a", 4)], "{engine:?}");
            db.write(|c| {
                c.execute(
                    "UPDATE audit_log SET outcome = 'PERMISSION_DENIED' WHERE seq = 4",
                    gpufleet_sql::params![],
                )
            })
            .unwrap();
            let v = db.read(|c| verify(c)).unwrap();
            assert_eq!(v.broken.len(), 1, "{engine:?}: {v:?}");
            assert!(
                v.broken[0].why.contains(
                    "entry 4 of tenant team-a's chain does not match the hash entry 7 carries"
                ),
                "{engine:?}: {v:?}"
            );
        }
    }
}
