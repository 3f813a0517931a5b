//! Leases: one row per named lease, with its holder, its epoch and when it expires (Unix
//! seconds of the control plane's clock). The singletons' work runs on the replica that
//! holds the `singletons` lease (`crate::lease`).
//!
//! The epoch is the fence. A takeover (a holder other than the row's, once the row has
//! expired, or the first acquisition) raises it; a renewal by the holder keeps it. Every
//! write of a singleton checks [`held`] in its own transaction, so a replica whose lease
//! was taken over (paused, partitioned, its clock behind) writes nothing. A released lease
//! keeps its row and epoch: the next takeover still raises it. Callers run [`acquire`] and
//! [`release`] inside a write transaction, which makes their read and write one step.

use rusqlite::{Connection, OptionalExtension};

/// A lease as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub name: String,
    pub holder: String,
    /// At least 1; raised by every takeover.
    pub epoch: i64,
    pub expires_at: i64,
}

/// What [`acquire`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The caller holds the lease now (taken, taken over or renewed) until `expires_at`.
    Held(Lease),
    /// Another holder's lease has not expired: the caller holds nothing.
    Busy(Lease),
}

fn lease(r: &rusqlite::Row<'_>) -> rusqlite::Result<Lease> {
    Ok(Lease {
        name: r.get(0)?,
        holder: r.get(1)?,
        epoch: r.get(2)?,
        expires_at: r.get(3)?,
    })
}

/// The lease `name`, if it was ever taken.
pub fn get(conn: &Connection, name: &str) -> rusqlite::Result<Option<Lease>> {
    conn.prepare_cached("SELECT name, holder, epoch, expires_at FROM leases WHERE name = ?1")?
        .query_row([name], lease)
        .optional()
}

/// Takes, takes over or renews the lease `name` for `holder` until `now + ttl_secs`.
/// The holder renews whatever the expiry says (nobody held it in between: the row still
/// names it) and keeps the epoch. Another holder's lease is taken over once it has
/// expired, or at once with `exclusive` (the caller knows no other holder can be alive:
/// `serve` holds the data dir's lock on an SQLite store); a takeover sets the epoch to
/// the old one plus one, or to `now` when that is greater, so that a store put back from
/// a backup still fences above the epochs agents saw since. `ttl_secs` is at least 1.
pub fn acquire(
    conn: &Connection,
    name: &str,
    holder: &str,
    ttl_secs: i64,
    now: i64,
    exclusive: bool,
) -> rusqlite::Result<Acquired> {
    let expires_at = now.saturating_add(ttl_secs.max(1));
    let epoch = match get(conn, name)? {
        Some(l) if l.holder == holder => l.epoch,
        Some(l) if l.expires_at > now && !exclusive => return Ok(Acquired::Busy(l)),
        Some(l) => l.epoch.saturating_add(1).max(now),
        None => now.max(1),
    };
    super::exec(
        conn,
        "INSERT INTO leases (name, holder, epoch, expires_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (name) DO UPDATE SET holder = ?2, epoch = ?3, expires_at = ?4",
        rusqlite::params![name, holder, epoch, expires_at],
    )?;
    Ok(Acquired::Held(Lease {
        name: name.to_string(),
        holder: holder.to_string(),
        epoch,
        expires_at,
    }))
}

/// Ends `holder`'s lease of `epoch` now (a stopping replica), so that another takes it
/// over without waiting for the expiry. The row and its epoch stay. Whether it was held.
pub fn release(
    conn: &Connection,
    name: &str,
    holder: &str,
    epoch: i64,
    now: i64,
) -> rusqlite::Result<bool> {
    let n = super::exec(
        conn,
        "UPDATE leases SET expires_at = MIN(expires_at, ?4)
         WHERE name = ?1 AND holder = ?2 AND epoch = ?3",
        rusqlite::params![name, holder, epoch, now],
    )?;
    Ok(n == 1)
}

/// The fence: whether `holder` still holds the lease `name` at `epoch`. A write of a
/// singleton calls it in its own transaction and writes nothing when it is false. An
/// expired lease nobody took over is still held: no one else has written under a newer
/// epoch.
pub fn held(conn: &Connection, name: &str, holder: &str, epoch: i64) -> rusqlite::Result<bool> {
    Ok(get(conn, name)?.is_some_and(|l| l.holder == holder && l.epoch == epoch))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAME: &str = "singletons";

    fn store() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let conn = super::super::open(&dir.path().join("state.db")).unwrap();
        (dir, conn)
    }

    fn held_lease(a: Acquired) -> Lease {
        match a {
            Acquired::Held(l) => l,
            Acquired::Busy(l) => panic!("expected to hold the lease, {} holds it", l.holder),
        }
    }

    #[test]
    fn the_first_holder_takes_it_and_renewing_keeps_the_epoch() {
        let (_dir, conn) = store();
        let first = held_lease(acquire(&conn, NAME, "a", 15, 1000, false).unwrap());
        assert_eq!((first.holder.as_str(), first.expires_at), ("a", 1015));
        // Renewed before and after its expiry (nobody took it): the same epoch, later.
        let renewed = held_lease(acquire(&conn, NAME, "a", 15, 1010, false).unwrap());
        assert_eq!((renewed.epoch, renewed.expires_at), (first.epoch, 1025));
        let late = held_lease(acquire(&conn, NAME, "a", 15, 2000, false).unwrap());
        assert_eq!((late.epoch, late.expires_at), (first.epoch, 2015));
        assert_eq!(get(&conn, NAME).unwrap(), Some(late));
    }

    #[test]
    fn another_holder_waits_for_the_expiry_then_takes_over_with_a_higher_epoch() {
        let (_dir, conn) = store();
        let a = held_lease(acquire(&conn, NAME, "a", 15, 1000, false).unwrap());
        // Before the expiry: refused, and the row is a's, unchanged.
        match acquire(&conn, NAME, "b", 15, 1014, false).unwrap() {
            Acquired::Busy(l) => assert_eq!(l, a),
            Acquired::Held(_) => panic!("b took a lease that had not expired"),
        }
        assert_eq!(get(&conn, NAME).unwrap(), Some(a.clone()));
        // At the expiry: b's, with a higher epoch.
        let b = held_lease(acquire(&conn, NAME, "b", 15, 1015, false).unwrap());
        assert_eq!(b.holder, "b");
        assert!(b.epoch > a.epoch, "{} after {}", b.epoch, a.epoch);
        // a's renewal is now refused: b holds it.
        assert!(matches!(
            acquire(&conn, NAME, "a", 15, 1016, false).unwrap(),
            Acquired::Busy(l) if l == b
        ));
        // A takeover is at least the old epoch plus one, even with the clock behind.
        let a2 = held_lease(acquire(&conn, NAME, "a", 15, 5, true).unwrap());
        assert_eq!(a2.epoch, b.epoch + 1);
    }

    #[test]
    fn an_exclusive_start_takes_over_at_once() {
        let (_dir, conn) = store();
        let old = held_lease(acquire(&conn, NAME, "host-1", 15, 1000, false).unwrap());
        let new = held_lease(acquire(&conn, NAME, "host-2", 15, 1001, true).unwrap());
        assert!(new.epoch > old.epoch);
        assert!(!held(&conn, NAME, "host-1", old.epoch).unwrap());
        assert!(held(&conn, NAME, "host-2", new.epoch).unwrap());
    }

    #[test]
    fn a_released_lease_is_taken_over_at_once_and_keeps_raising_the_epoch() {
        let (_dir, conn) = store();
        let a = held_lease(acquire(&conn, NAME, "a", 300, 1000, false).unwrap());
        // Only the holder of that epoch releases it.
        assert!(!release(&conn, NAME, "b", a.epoch, 1001).unwrap());
        assert!(!release(&conn, NAME, "a", a.epoch + 1, 1001).unwrap());
        assert!(release(&conn, NAME, "a", a.epoch, 1001).unwrap());
        let b = held_lease(acquire(&conn, NAME, "b", 300, 1002, false).unwrap());
        assert!(b.epoch > a.epoch);
    }

    #[test]
    fn a_write_under_a_stale_epoch_is_refused_and_writes_nothing() {
        let (_dir, mut conn) = store();
        let a = held_lease(acquire(&conn, NAME, "a", 15, 1000, false).unwrap());
        let b = held_lease(acquire(&conn, NAME, "b", 15, 1100, false).unwrap());
        // A singleton's write: the fence first, then the write, in one transaction.
        let write = |conn: &mut Connection, holder: &str, epoch: i64| -> bool {
            let tx = conn.transaction().unwrap();
            super::super::events::record(&tx, 1100, "n1", "", "node_unreachable", "n1", holder)
                .unwrap();
            if !held(&tx, NAME, holder, epoch).unwrap() {
                return false; // dropped: rolled back
            }
            tx.commit().unwrap();
            true
        };
        assert!(!write(&mut conn, "a", a.epoch));
        let events = super::super::events::list(&conn, "n1").unwrap();
        assert!(events.is_empty(), "the stale leader wrote {events:?}");
        assert!(write(&mut conn, "b", b.epoch));
        let events = super::super::events::list(&conn, "n1").unwrap();
        assert_eq!(events.len(), 1);
    }
}
