//! The jobs a cluster's controller on this node ended as orphans: a node that joins a new
//! controller (its head lost without shared storage, so the new one starts with an empty
//! queue) reports the steps it still runs, the controller knows no such job and ends them
//! (`Orphan StepId=12.0 reported on node g2`, `Killing orphan batch JobId=12` in its log).
//! Each is read from the controller's log once, past a cursor kept beside it (so that a
//! restarted agent does not report it again), for the control plane to tell the team the
//! job ended (NODE_FAIL). Bounded: at most [`MAX_READ`] bytes of log and [`MAX_JOBS`] jobs
//! per call; the rest waits for the next.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use gpufleet_proto::v1;

/// Most bytes of the log read at once.
const MAX_READ: u64 = 1 << 20;
/// Most jobs reported at once.
pub const MAX_JOBS: usize = 256;
/// Longest node name kept.
const MAX_NODE: usize = 64;

/// The orphan jobs the controller whose files are in `ctld` (its `slurmctld.log`) logged
/// since the last call, each once; the cursor (`orphans.cursor`) moves past what was read.
pub fn since_last(ctld: &Path) -> Vec<v1::OrphanJob> {
    let log_path = ctld.join("slurmctld.log");
    let cursor_path = ctld.join("orphans.cursor");
    let Ok(mut log) = std::fs::File::open(&log_path) else {
        return Vec::new();
    };
    let len = log.metadata().map(|m| m.len()).unwrap_or(0);
    let mut at: u64 = std::fs::read_to_string(&cursor_path)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0);
    // A log shorter than the cursor is a new one (the controller's files made again).
    if at > len {
        at = 0;
    }
    let mut text = Vec::new();
    if log.seek(SeekFrom::Start(at)).is_err() || log.take(MAX_READ).read_to_end(&mut text).is_err()
    {
        return Vec::new();
    }
    // Whole lines only: a line being written is read at the next call.
    let Some(end) = text.iter().rposition(|b| *b == b'\n') else {
        return Vec::new();
    };
    let mut jobs: Vec<v1::OrphanJob> = Vec::new();
    let mut consumed = 0;
    for line in text[..=end].split_inclusive(|b| *b == b'\n') {
        if jobs.len() == MAX_JOBS {
            break;
        }
        consumed += line.len();
        if let Some(orphan) = parse(&String::from_utf8_lossy(line)) {
            match jobs.iter_mut().find(|j| j.job_id == orphan.job_id) {
                Some(known) if known.node.is_empty() => known.node = orphan.node,
                Some(_) => {}
                None => jobs.push(orphan),
            }
        }
    }
    let cursor = (at + consumed as u64).to_string();
    if let Err(e) = std::fs::write(&cursor_path, cursor) {
        tracing::warn!(path = %cursor_path.display(), error = %e, "cannot keep the orphan jobs' cursor");
    }
    jobs
}

/// The orphan job one line of slurmctld's log names, if any.
fn parse(line: &str) -> Option<v1::OrphanJob> {
    let digits = |s: &str| -> Option<u64> {
        let n: String = s.chars().take_while(char::is_ascii_digit).collect();
        n.parse().ok().filter(|id| *id > 0)
    };
    let orphan = line
        .split_once("Orphan StepId=")
        .or_else(|| line.split_once("Orphan JobId="));
    if let Some((_, rest)) = orphan {
        let job_id = digits(rest)?;
        let node = rest
            .split_once(" reported on node ")
            .map(|(_, n)| n.trim())
            .unwrap_or_default();
        let plain = node
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
        return Some(v1::OrphanJob {
            job_id,
            node: if plain && node.len() <= MAX_NODE {
                node.to_string()
            } else {
                String::new()
            },
        });
    }
    let (_, rest) = line.split_once("Killing orphan batch JobId=")?;
    Some(v1::OrphanJob {
        job_id: digits(rest)?,
        node: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
[2026-12-06T05:00:01.000] slurmctld version 22.05.8 started on cluster gf0123
[2026-12-06T05:00:02.000] error: Orphan StepId=12.0 reported on node g2
[2026-12-06T05:00:02.001] error: Orphan StepId=12.extern reported on node g2
[2026-12-06T05:00:02.002] Killing orphan batch JobId=12
[2026-12-06T05:00:02.003] Killing orphan batch JobId=14
";

    fn ids(jobs: &[v1::OrphanJob]) -> Vec<(u64, &str)> {
        jobs.iter().map(|j| (j.job_id, j.node.as_str())).collect()
    }

    #[test]
    fn each_orphan_job_is_read_once_with_its_node_past_a_kept_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("slurmctld.log");
        std::fs::write(&log, LOG).unwrap();
        assert_eq!(ids(&since_last(dir.path())), [(12, "g2"), (14, "")]);
        assert!(since_last(dir.path()).is_empty(), "read once");
        // A line still being written waits; a finished one is read.
        let more = format!("{LOG}[t] error: Orphan StepId=20.batch reported on node g3");
        std::fs::write(&log, &more).unwrap();
        assert!(since_last(dir.path()).is_empty());
        std::fs::write(&log, format!("{more}\n")).unwrap();
        assert_eq!(ids(&since_last(dir.path())), [(20, "g3")]);
        // A new, shorter log is read from its start.
        std::fs::write(&log, "[t] Killing orphan batch JobId=7\n").unwrap();
        assert_eq!(ids(&since_last(dir.path())), [(7, "")]);
    }

    #[test]
    fn lines_that_name_no_orphan_or_a_strange_node_are_not_taken_for_one() {
        assert!(parse("[t] _job_complete: JobId=12 done").is_none());
        assert!(parse("[t] error: Orphan StepId=x.0 reported on node g2").is_none());
        let odd = parse("[t] error: Orphan StepId=5.0 reported on node g2; rm -rf").unwrap();
        assert_eq!((odd.job_id, odd.node.as_str()), (5, ""));
    }
}
