//! Leases: one row per named lease, with its holder, its epoch and when it expires (Unix
//! seconds of the control plane's clock). The singletons' work runs on the replica that
//! holds the `singletons` lease (`crate::lease`).
//!
//! The epoch is the fence. A takeover (a holder other than the row's, once the row has
//! expired, or the first acquisition) raises it; a renewal by the holder keeps it. Every
//! write of a singleton checks [`held`] in its own transaction, so a replica whose lease
//! was taken over (paused, partitioned, its clock behind) writes nothing. A released lease
//! keeps its row and epoch: the next takeover still raises it. Callers run [`acquire`] and
//! [`release`] inside a write transaction, which makes their read and write one step: on
//! SQLite the one writer's, on PostgreSQL a serializable transaction, which fails one of
//! two replicas that read the same expired row (and it is run again, and finds the other's
//! lease). The same statements run on both engines (`gpufleet_sql`).

use gpufleet_sql::{params, AsConn, Row};

/// A lease as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub name: String,
    pub holder: String,
    /// At least 1; raised by every takeover.
    pub epoch: i64,
    pub expires_at: i64,
    /// Where the holder serves its API ('' when it has not said yet): replicas that do not
    /// lead forward requests there.
    pub holder_url: String,
}

/// What [`acquire`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The caller holds the lease now (taken, taken over or renewed) until `expires_at`.
    Held(Lease),
    /// Another holder's lease has not expired: the caller holds nothing.
    Busy(Lease),
}

fn lease(r: &Row) -> gpufleet_sql::Result<Lease> {
    Ok(Lease {
        name: r.get(0)?,
        holder: r.get(1)?,
        epoch: r.get(2)?,
        expires_at: r.get(3)?,
        holder_url: r.get(4)?,
    })
}

/// The lease `name`, if it was ever taken.
pub fn get(conn: &impl AsConn, name: &str) -> gpufleet_sql::Result<Option<Lease>> {
    conn.as_conn().query_opt(
        "SELECT name, holder, epoch, expires_at, holder_url FROM leases WHERE name = ?1",
        params![name],
        lease,
    )
}

/// Takes, takes over or renews the lease `name` for `holder`, which serves its API at
/// `holder_url`, until `now + ttl_secs`.
/// The holder renews whatever the expiry says (nobody held it in between: the row still
/// names it) and keeps the epoch. Another holder's lease is taken over once it has
/// expired, or at once with `exclusive` (the caller knows no other holder can be alive:
/// `serve` holds the data dir's lock on an SQLite store); a takeover sets the epoch to
/// the old one plus one, or to `now` when that is greater, so that a store put back from
/// a backup still fences above the epochs agents saw since. `ttl_secs` is at least 1.
pub fn acquire(
    conn: &impl AsConn,
    name: &str,
    holder: &str,
    holder_url: &str,
    ttl_secs: i64,
    now: i64,
    exclusive: bool,
) -> gpufleet_sql::Result<Acquired> {
    let expires_at = now.saturating_add(ttl_secs.max(1));
    let epoch = match get(conn, name)? {
        Some(l) if l.holder == holder => l.epoch,
        Some(l) if l.expires_at > now && !exclusive => return Ok(Acquired::Busy(l)),
        Some(l) => l.epoch.saturating_add(1).max(now),
        None => now.max(1),
    };
    conn.as_conn().execute(
        "INSERT INTO leases (name, holder, epoch, expires_at, holder_url) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (name) DO UPDATE SET holder = ?2, epoch = ?3, expires_at = ?4, holder_url = ?5",
        params![name, holder, epoch, expires_at, holder_url],
    )?;
    Ok(Acquired::Held(Lease {
        name: name.to_string(),
        holder: holder.to_string(),
        epoch,
        expires_at,
        holder_url: holder_url.to_string(),
    }))
}

/// Ends `holder`'s lease of `epoch` now (a stopping replica), so that another takes it
/// over without waiting for the expiry. The row and its epoch stay. Whether it was held.
pub fn release(
    conn: &impl AsConn,
    name: &str,
    holder: &str,
    epoch: i64,
    now: i64,
) -> gpufleet_sql::Result<bool> {
    // CASE, not MIN(a, b) (SQLite) or LEAST (PostgreSQL): one statement for both.
    let n = conn.as_conn().execute(
        "UPDATE leases SET expires_at = CASE WHEN expires_at < ?4 THEN expires_at ELSE ?4 END
         WHERE name = ?1 AND holder = ?2 AND epoch = ?3",
        params![name, holder, epoch, now],
    )?;
    Ok(n == 1)
}

/// The fence: whether `holder` still holds the lease `name` at `epoch`. A write of a
/// singleton calls it in its own transaction and writes nothing when it is false. An
/// expired lease nobody took over is still held: no one else has written under a newer
/// epoch.
pub fn held(
    conn: &impl AsConn,
    name: &str,
    holder: &str,
    epoch: i64,
) -> gpufleet_sql::Result<bool> {
    Ok(get(conn, name)?.is_some_and(|l| l.holder == holder && l.epoch == epoch))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::engines::{self, on_both};
    use gpufleet_sql::Database;

    const NAME: &str = "singletons";

    fn take(db: &mut Database, holder: &str, ttl: i64, now: i64, exclusive: bool) -> Acquired {
        let url = format!("http://{holder}:7700");
        db.write(|c| acquire(c, NAME, holder, &url, ttl, now, exclusive))
            .unwrap()
    }

    fn held_lease(a: Acquired) -> Lease {
        match a {
            Acquired::Held(l) => l,
            Acquired::Busy(l) => panic!("expected to hold the lease, {} holds it", l.holder),
        }
    }

    fn row(db: &mut Database) -> Option<Lease> {
        db.read(|c| get(c, NAME)).unwrap()
    }

    #[test]
    fn the_first_holder_takes_it_and_renewing_keeps_the_epoch() {
        on_both(|db| {
            let first = held_lease(take(db, "a", 15, 1000, false));
            assert_eq!((first.holder.as_str(), first.expires_at), ("a", 1015));
            // Renewed before and after its expiry (nobody took it): the same epoch, later.
            let renewed = held_lease(take(db, "a", 15, 1010, false));
            assert_eq!((renewed.epoch, renewed.expires_at), (first.epoch, 1025));
            let late = held_lease(take(db, "a", 15, 2000, false));
            assert_eq!((late.epoch, late.expires_at), (first.epoch, 2015));
            assert_eq!(row(db), Some(late));
        });
    }

    #[test]
    fn another_holder_waits_for_the_expiry_then_takes_over_with_a_higher_epoch() {
        on_both(|db| {
            let a = held_lease(take(db, "a", 15, 1000, false));
            // Before the expiry: refused, and the row is a's, unchanged; the answer says
            // where a serves (b forwards requests there).
            match take(db, "b", 15, 1014, false) {
                Acquired::Busy(l) => {
                    assert_eq!(l, a);
                    assert_eq!(l.holder_url, "http://a:7700");
                }
                Acquired::Held(_) => panic!("b took a lease that had not expired"),
            }
            assert_eq!(row(db), Some(a.clone()));
            // At the expiry: b's, with a higher epoch.
            let b = held_lease(take(db, "b", 15, 1015, false));
            assert_eq!(b.holder, "b");
            assert!(b.epoch > a.epoch, "{} after {}", b.epoch, a.epoch);
            // a's renewal is now refused: b holds it.
            assert!(matches!(take(db, "a", 15, 1016, false), Acquired::Busy(l) if l == b));
            // A takeover is at least the old epoch plus one, even with the clock behind.
            let a2 = held_lease(take(db, "a", 15, 5, true));
            assert_eq!(a2.epoch, b.epoch + 1);
        });
    }

    #[test]
    fn an_exclusive_start_takes_over_at_once() {
        on_both(|db| {
            let old = held_lease(take(db, "host-1", 15, 1000, false));
            let new = held_lease(take(db, "host-2", 15, 1001, true));
            assert!(new.epoch > old.epoch);
            let (old_held, new_held) = db
                .read(|c| {
                    Ok((
                        held(c, NAME, "host-1", old.epoch)?,
                        held(c, NAME, "host-2", new.epoch)?,
                    ))
                })
                .unwrap();
            assert!(!old_held && new_held);
        });
    }

    #[test]
    fn a_released_lease_is_taken_over_at_once_and_keeps_raising_the_epoch() {
        on_both(|db| {
            let a = held_lease(take(db, "a", 300, 1000, false));
            let mut release_by = |holder: &str, epoch: i64| {
                db.write(|c| release(c, NAME, holder, epoch, 1001)).unwrap()
            };
            // Only the holder of that epoch releases it.
            assert!(!release_by("b", a.epoch));
            assert!(!release_by("a", a.epoch + 1));
            assert!(release_by("a", a.epoch));
            assert_eq!(row(db).unwrap().expires_at, 1001);
            let b = held_lease(take(db, "b", 300, 1002, false));
            assert!(b.epoch > a.epoch);
        });
    }

    /// A singleton's write: the fence, then the write, in one transaction; whether it
    /// committed.
    fn fenced_write(db: &mut Database, holder: &str, epoch: i64) -> bool {
        db.write(|c| {
            c.execute(
                "INSERT INTO fenced (epoch, holder) VALUES (?1, ?2)",
                params![epoch, holder],
            )?;
            if !held(c, NAME, holder, epoch)? {
                // Nothing of this transaction stays.
                return Err(gpufleet_sql::Error::NoRows);
            }
            Ok(())
        })
        .is_ok()
    }

    fn fenced_table(db: &mut Database) {
        db.conn()
            .execute_batch("CREATE TABLE fenced (epoch BIGINT NOT NULL, holder TEXT NOT NULL)")
            .unwrap();
    }

    fn fenced_rows(db: &mut Database) -> Vec<(i64, String)> {
        db.read(|c| {
            c.query_map(
                "SELECT epoch, holder FROM fenced ORDER BY epoch, holder",
                params![],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .unwrap()
    }

    #[test]
    fn a_write_under_a_stale_epoch_is_refused_and_writes_nothing() {
        on_both(|db| {
            fenced_table(db);
            let a = held_lease(take(db, "a", 15, 1000, false));
            let b = held_lease(take(db, "b", 15, 1100, false));
            assert!(!fenced_write(db, "a", a.epoch));
            assert!(fenced_rows(db).is_empty(), "the stale leader wrote");
            assert!(fenced_write(db, "b", b.epoch));
            assert_eq!(fenced_rows(db), vec![(b.epoch, "b".to_string())]);
        });
    }

    /// Replicas on one PostgreSQL database, each with its own connection, race for the
    /// lease at every tick of a shared clock (a TTL of one tick, so it is up for grabs at
    /// each) and write behind its fence. Serializable transactions keep it exact: no
    /// epoch was ever held by two replicas, and every fenced write that committed was
    /// made under the epoch its writer held and nobody had taken over since.
    #[test]
    fn replicas_racing_for_the_lease_on_postgres_never_share_an_epoch() {
        const REPLICAS: usize = 4;
        const TICKS: i64 = 60;
        let (_guard, mut db, url) = engines::postgres();
        fenced_table(&mut db);
        // All start each tick together, so that they race rather than take turns.
        let tick_start = std::sync::Barrier::new(REPLICAS);
        let held_answers: Vec<Vec<Lease>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..REPLICAS)
                .map(|r| {
                    let url = url.clone();
                    let tick_start = &tick_start;
                    s.spawn(move || {
                        let mut db = Database::postgres(&url).unwrap();
                        let me = format!("replica-{r}");
                        let mut held = Vec::new();
                        for tick in 0..TICKS {
                            tick_start.wait();
                            if let Acquired::Held(l) = take(&mut db, &me, 1, 1000 + tick, false) {
                                fenced_write(&mut db, &me, l.epoch);
                                held.push(l);
                            }
                        }
                        held
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let mut holder_of = std::collections::BTreeMap::<i64, String>::new();
        for l in held_answers.iter().flatten() {
            let first = holder_of.entry(l.epoch).or_insert_with(|| l.holder.clone());
            assert_eq!(first, &l.holder, "epoch {} held by two replicas", l.epoch);
        }
        let writes = fenced_rows(&mut db);
        for (epoch, holder) in &writes {
            assert_eq!(
                holder_of.get(epoch),
                Some(holder),
                "a write under epoch {epoch}"
            );
        }
        let last = row(&mut db).unwrap();
        assert_eq!(holder_of.keys().last(), Some(&last.epoch));
        eprintln!(
            "{} takeovers among {REPLICAS} replicas, {} fenced writes committed",
            holder_of.len(),
            writes.len()
        );
        // The race happened: the lease changed hands.
        assert!(holder_of.len() > 1, "{holder_of:?}");
    }
}
