//! The agent's order journal, `<data-dir>/orders.json`: every order it has started, the
//! node's GPUs before it, and its answer once there is one. It makes orders idempotent: an
//! order id already answered is replayed, never run again, and an order cut short by a
//! crash is settled from the hardware's state when the agent starts again.
//!
//! It is bounded per agent: the newest [`KEEP`] answered orders, each without the GPUs
//! before it once answered (only a cut-short order is put back from them), and the orders
//! not answered yet (the one running; one a crash cut short until the next start settles
//! it), which are never dropped: dropping one would let a re-sent order run twice.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gpufleet_gpu::hardware::GpuInfo;
use gpufleet_proto::v1;
use serde::{Deserialize, Serialize};

/// How many answered orders are kept (oldest dropped first); the control plane never
/// re-sends an order older than its last few. docs/guides/node-agents.md names it.
pub const KEEP: usize = 256;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Answer {
    pub ok: bool,
    pub error: String,
    pub error_kind: String,
    /// A health check's verdicts, so a replayed answer carries them too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<Health>,
}

/// `v1::HealthReport` as the journal keeps it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Health {
    pub level: String,
    pub finished_at: i64,
    pub checks: Vec<Check>,
}

/// `v1::CheckResult` as the journal keeps it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Check {
    pub name: String,
    #[serde(default)]
    pub gpu_uuid: String,
    pub verdict: String,
    #[serde(default)]
    pub value: String,
    #[serde(default)]
    pub threshold: String,
    #[serde(default)]
    pub detail: String,
    #[serde(default)]
    pub peer: String,
    #[serde(default)]
    pub gbps: f64,
}

impl From<&v1::HealthReport> for Health {
    fn from(r: &v1::HealthReport) -> Self {
        Self {
            level: r.level.clone(),
            finished_at: r.finished_at,
            checks: r
                .checks
                .iter()
                .map(|c| Check {
                    name: c.name.clone(),
                    gpu_uuid: c.gpu_uuid.clone(),
                    verdict: c.verdict.clone(),
                    value: c.value.clone(),
                    threshold: c.threshold.clone(),
                    detail: c.detail.clone(),
                    peer: c.peer.clone(),
                    gbps: c.gbps,
                })
                .collect(),
        }
    }
}

impl Health {
    pub fn to_report(&self) -> v1::HealthReport {
        v1::HealthReport {
            level: self.level.clone(),
            finished_at: self.finished_at,
            checks: self
                .checks
                .iter()
                .map(|c| v1::CheckResult {
                    name: c.name.clone(),
                    gpu_uuid: c.gpu_uuid.clone(),
                    verdict: c.verdict.clone(),
                    value: c.value.clone(),
                    threshold: c.threshold.clone(),
                    detail: c.detail.clone(),
                    peer: c.peer.clone(),
                    gbps: c.gbps,
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    /// Order of arrival, for trimming.
    pub seq: u64,
    /// The GPUs before the order ran, to restore them.
    pub before: Vec<GpuInfo>,
    /// The order's target per GPU index, as sent (placements; None: whole GPU).
    pub target: Vec<(u32, Option<Vec<TargetPlacement>>)>,
    /// For a driver order: the version it installs.
    #[serde(default)]
    pub driver: Option<String>,
    /// A health check (recorded when answered).
    #[serde(default)]
    pub check: bool,
    /// Times the order's hardware steps were started (stays 1: orders never run twice).
    pub runs: u32,
    pub answer: Option<Answer>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TargetPlacement {
    pub profile: String,
    pub profile_id: u32,
    pub start: u8,
    pub size: u8,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    next_seq: u64,
    orders: BTreeMap<String, Entry>,
}

pub struct Journal {
    path: PathBuf,
    file: File,
}

impl Journal {
    pub fn open(data_dir: &Path) -> anyhow::Result<Self> {
        let path = data_dir.join("orders.json");
        let file = match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| {
                anyhow::anyhow!("{}: not a valid order journal: {e}", path.display())
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => File::default(),
            Err(e) => return Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
        };
        let mut journal = Self { path, file };
        // A journal an earlier agent kept whole shrinks at its next save.
        for entry in journal.file.orders.values_mut() {
            if entry.answer.is_some() {
                entry.before.clear();
            }
        }
        journal.trim();
        Ok(journal)
    }

    pub fn get(&self, id: &str) -> Option<&Entry> {
        self.file.orders.get(id)
    }

    /// Records that `id` starts now (durably, before any hardware step).
    pub fn start(
        &mut self,
        id: &str,
        before: Vec<GpuInfo>,
        target: Vec<(u32, Option<Vec<TargetPlacement>>)>,
        driver: Option<String>,
    ) -> std::io::Result<()> {
        let seq = self.file.next_seq;
        self.file.next_seq += 1;
        let entry = self.file.orders.entry(id.to_string()).or_insert(Entry {
            seq,
            before,
            target,
            driver,
            check: false,
            runs: 0,
            answer: None,
        });
        entry.runs += 1;
        self.trim();
        self.save()
    }

    /// Records a health check once it is answered. Checks change nothing, so they are
    /// not journaled before they run: one cut short is simply run again when re-sent.
    pub fn record_check(&mut self, id: &str, answer: Answer) -> std::io::Result<()> {
        let seq = self.file.next_seq;
        self.file.next_seq += 1;
        self.file.orders.insert(
            id.to_string(),
            Entry {
                seq,
                before: Vec::new(),
                target: Vec::new(),
                driver: None,
                check: true,
                runs: 1,
                answer: Some(answer),
            },
        );
        self.trim();
        self.save()
    }

    pub fn finish(&mut self, id: &str, answer: Answer) -> std::io::Result<()> {
        if let Some(e) = self.file.orders.get_mut(id) {
            e.answer = Some(answer);
            // Answered, it is replayed and never put back: what it changed is not needed.
            e.before.clear();
        }
        self.save()
    }

    /// Orders started and never answered (the agent stopped in the middle).
    pub fn unanswered(&self) -> Vec<(String, Entry)> {
        self.file
            .orders
            .iter()
            .filter(|(_, e)| e.answer.is_none())
            .map(|(id, e)| (id.clone(), e.clone()))
            .collect()
    }

    /// Drops the oldest answered orders past [`KEEP`]; unanswered ones stay.
    fn trim(&mut self) {
        let mut answered: Vec<(u64, String)> = self
            .file
            .orders
            .iter()
            .filter(|(_, e)| e.answer.is_some())
            .map(|(id, e)| (e.seq, id.clone()))
            .collect();
        if answered.len() <= KEEP {
            return;
        }
        answered.sort();
        for (_, id) in &answered[..answered.len() - KEEP] {
            self.file.orders.remove(id);
        }
    }

    /// Written to a temporary file and renamed, so a crash leaves the old or the new one.
    fn save(&self) -> std::io::Result<()> {
        let tmp = self.path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&self.file)?)?;
        std::fs::rename(&tmp, &self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_survive_a_reopen_and_unanswered_orders_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path()).unwrap();
        j.start("a", vec![], vec![], None).unwrap();
        j.finish(
            "a",
            Answer {
                ok: true,
                error: String::new(),
                error_kind: String::new(),
                health: None,
            },
        )
        .unwrap();
        j.start("b", vec![], vec![], None).unwrap();
        let j = Journal::open(dir.path()).unwrap();
        assert!(j.get("a").unwrap().answer.as_ref().unwrap().ok);
        assert_eq!(j.get("a").unwrap().runs, 1);
        let open: Vec<String> = j.unanswered().into_iter().map(|(id, _)| id).collect();
        assert_eq!(open, vec!["b".to_string()]);
    }

    #[test]
    fn a_health_report_survives_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path()).unwrap();
        let report = v1::HealthReport {
            level: "medium".into(),
            finished_at: 1_700_000_000,
            checks: vec![v1::CheckResult {
                name: "bandwidth".into(),
                verdict: "fail".into(),
                value: "0.020 Gbit/s".into(),
                threshold: ">= 1.00 Gbit/s".into(),
                detail: "to n2".into(),
                peer: "n2".into(),
                gbps: 0.02,
                ..Default::default()
            }],
        };
        j.record_check(
            "c1",
            Answer {
                ok: true,
                error: String::new(),
                error_kind: String::new(),
                health: Some((&report).into()),
            },
        )
        .unwrap();
        let j = Journal::open(dir.path()).unwrap();
        let entry = j.get("c1").unwrap();
        assert!(entry.check && entry.runs == 1);
        assert!(j.unanswered().is_empty());
        let back = entry.answer.as_ref().unwrap().health.as_ref().unwrap();
        assert_eq!(back.to_report(), report);
    }

    fn ok() -> Answer {
        Answer {
            ok: true,
            error: String::new(),
            error_kind: String::new(),
            health: None,
        }
    }

    fn gpus(n: u32) -> Vec<GpuInfo> {
        (0..n)
            .map(|index| GpuInfo {
                index,
                uuid: format!("GPU-{index:032}"),
                model: "H100-80GB".into(),
                memory_mib: 81_559,
                mig_enabled: false,
                instances: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn the_journal_keeps_the_newest_answers_without_their_gpus_and_every_open_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path()).unwrap();
        j.start("cut-short", gpus(8), vec![], None).unwrap();
        let size_after = |orders: std::ops::Range<usize>| {
            let mut j = Journal::open(dir.path()).unwrap();
            for i in orders {
                let id = format!("o{i}");
                j.start(&id, gpus(8), vec![(0, None)], None).unwrap();
                j.finish(&id, ok()).unwrap();
                j.record_check(&format!("c{i}"), ok()).unwrap();
            }
            std::fs::metadata(dir.path().join("orders.json"))
                .unwrap()
                .len()
        };
        let n = 2 * KEEP;
        let size = size_after(0..n);
        let j = Journal::open(dir.path()).unwrap();
        assert_eq!(
            j.file.orders.len(),
            KEEP + 1,
            "the newest answers and the open order"
        );
        assert_eq!(j.unanswered()[0].0, "cut-short");
        assert_eq!(j.unanswered()[0].1.before, gpus(8), "kept to be put back");
        assert!(j.get(&format!("c{}", n - 1)).is_some());
        assert!(j
            .get(&format!("o{}", n - 1))
            .is_some_and(|e| e.before.is_empty()));
        assert!(j.get(&format!("o{}", n - KEEP / 2 - 1)).is_none());
        // As many orders again: the file does not grow (but for longer ids and numbers).
        let again = size_after(n..2 * n);
        assert!(again <= size + size / 10, "{size} then {again}");
        assert!(size < 256 << 10, "{size} bytes");
    }

    #[test]
    fn a_journal_kept_whole_by_an_earlier_agent_is_trimmed_when_opened() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = File::default();
        for i in 0..(KEEP as u64 + 40) {
            file.orders.insert(
                format!("o{i}"),
                Entry {
                    seq: i,
                    before: gpus(2),
                    target: vec![],
                    driver: None,
                    check: false,
                    runs: 1,
                    answer: Some(ok()),
                },
            );
        }
        file.next_seq = KEEP as u64 + 40;
        std::fs::write(
            dir.path().join("orders.json"),
            serde_json::to_vec(&file).unwrap(),
        )
        .unwrap();
        let j = Journal::open(dir.path()).unwrap();
        assert_eq!(j.file.orders.len(), KEEP);
        assert!(j.get("o39").is_none() && j.get("o40").is_some());
        assert!(j.file.orders.values().all(|e| e.before.is_empty()));
    }

    #[test]
    fn old_answers_are_trimmed_but_open_orders_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path()).unwrap();
        j.start("open", vec![], vec![], None).unwrap();
        for i in 0..(KEEP + 10) {
            let id = format!("o{i}");
            j.start(&id, vec![], vec![], None).unwrap();
            j.finish(
                &id,
                Answer {
                    ok: true,
                    error: String::new(),
                    error_kind: String::new(),
                    health: None,
                },
            )
            .unwrap();
        }
        assert!(j.get("open").is_some());
        assert!(j.get("o0").is_none());
        assert!(j.get(&format!("o{}", KEEP + 9)).is_some());
    }
}
