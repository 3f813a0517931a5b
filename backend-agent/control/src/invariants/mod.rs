//! The store's invariants, checked from outside the control plane (`gpufleet-agent
//! check`): read a committed snapshot of the store read-only (while `serve` runs, as a
//! WAL reader) and say every way it breaks what admission promises. One module per
//! concern, each its own arithmetic, not admission's:
//!
//! - `capacity`: no instant from now on at which a model's pool or on-demand nodes are
//!   overbooked by reservations and clusters;
//! - `quota`: no tenant over its quota at any instant from now on;
//! - `membership`: no node in two clusters (or in one that is not there or of another
//!   model), no reservation's clusters holding more than it has;
//! - `sequences`: each tenant's event and audit sequences gap-free and ordered;
//! - `answers`: every acknowledged create, resize and delete in an answers log holds;
//! - `usage`: the usage records count every GPU a cluster holds, and nothing else.
//!
//! Nothing here writes; the SQL is in `store::invariants`.

pub mod answers;
pub mod capacity;
pub mod membership;
pub mod quota;
pub mod sequences;
pub mod snapshot;
pub mod timeline;
pub mod usage;
pub mod violation;

#[cfg(test)]
mod tests;

use std::path::Path;

pub use answers::Answer;
pub use snapshot::Snapshot;
pub use violation::{Concern, Violation};

/// Every violation of the store at `path` seen from `now`, in the order of the concerns
/// above (and, with `answers`, of the answers log). The store is opened read-only.
pub fn check_store(
    path: &Path,
    now: i64,
    answers: Option<&[Answer]>,
) -> anyhow::Result<Vec<Violation>> {
    if !path.is_file() {
        anyhow::bail!("{}: no state database there", path.display());
    }
    let conn = crate::store::invariants::open_read_only(path)
        .map_err(|e| anyhow::anyhow!("cannot open {} read-only: {e}", path.display()))?;
    let snapshot = Snapshot::load(&mut gpufleet_sql::Database::sqlite(conn), now)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    Ok(check(&snapshot, answers))
}

/// The same on a store on PostgreSQL (`db`), read in one snapshot.
pub fn check_database(
    db: &mut gpufleet_sql::Database,
    now: i64,
    answers: Option<&[Answer]>,
) -> anyhow::Result<Vec<Violation>> {
    let snapshot = Snapshot::load(db, now)?;
    Ok(check(&snapshot, answers))
}

/// Every violation of `snapshot` (and of `answers`, when given).
pub fn check(snapshot: &Snapshot, answers: Option<&[Answer]>) -> Vec<Violation> {
    let mut out = capacity::check(snapshot);
    out.extend(quota::check(snapshot));
    out.extend(membership::check(snapshot));
    out.extend(sequences::check(snapshot));
    out.extend(usage::check(snapshot));
    if let Some(answers) = answers {
        out.extend(answers::check(snapshot, answers));
    }
    out
}
