//! Demand traces: rows of (team, GPU model, GPUs, submit time, duration), read from one of
//! two layouts, told apart by the header line:
//!
//! - the simple CSV `team,gpu_type,gpus,submit,duration`: `submit` is the time since the
//!   trace's start and `duration` how long the job holds its GPUs, each whole seconds or a
//!   whole number with a unit (`90s`, `15m`, `2h`, `1d`); optionally, after them and each
//!   at most once, the columns `used`, the fraction (0 to 1) of its GPUs the job keeps
//!   busy on average (empty: not reported; a job that does not report it counts as busy
//!   on every GPU it asked for), and `mig_profile`, a MIG profile of the row's model (e.g.
//!   `1g.10gb`) with which `gpus` counts instances of that profile instead of GPUs (empty:
//!   whole GPUs; [`crate::mig`] says how they are held);
//! - the pod list of Alibaba's `cluster-trace-gpu-v2023` (`name,cpu_milli,memory_mib,
//!   num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time`,
//!   in any order, other columns ignored): a row's team is the fleet's team number
//!   `FNV-1a-64(name) mod teams` (stable across runs and machines), its model is what the
//!   fleet's `[alibaba]` table says its `gpu_spec` means (the first alternative of
//!   `A|B` that it names; no spec: `default_gpu_type`), it is submitted at
//!   `creation_time` (less the trace's first) and holds `num_gpu` GPUs from
//!   `scheduled_time` to `deletion_time`. A GPU-sharing row (`gpu_milli` under 1000)
//!   takes a whole GPU, or, where the fleet's `[alibaba]` says `gpu_milli_as_mig = true`
//!   and its model has MIG, one MIG instance per GPU covering its share
//!   ([`crate::mig::profile_for_share`]); rows without GPUs, or that never ran, are
//!   counted and left out.
//!
//! Every row is checked against the fleet (a team it declares, a model that team has a
//! quota for) before anything runs; a refusal names the file, line and column.

use std::path::Path;

use crate::csv;
use crate::fleet::Fleet;
use crate::located::{read_bounded, Refusal};
use crate::mig::{self, Slices};

/// At most this many rows (a replay's memory stays bounded).
pub const MAX_ROWS: usize = 2_000_000;
/// A trace file larger than this is refused.
const MAX_BYTES: u64 = 1 << 30;
/// A job holds its GPUs at most this long (the API's longest reservation).
const MAX_DURATION: i64 = gpufleet_proto::limits::MAX_DURATION_SECONDS;
/// A job asks for at most this many GPUs.
const MAX_GPUS: i64 = 100_000;

pub const SIMPLE_COLUMNS: [&str; 5] = ["team", "gpu_type", "gpus", "submit", "duration"];
/// The simple layout's optional columns after [`SIMPLE_COLUMNS`]: the busy fraction of
/// the asked GPUs, and the MIG profile whose instances `gpus` counts.
pub const USED_COLUMN: &str = "used";
pub const MIG_COLUMN: &str = "mig_profile";
pub const ALIBABA_COLUMNS: [&str; 11] = [
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
];

/// One job of demand.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The line of the trace it came from.
    pub line: usize,
    /// Index into the fleet's teams.
    pub team: usize,
    pub gpu_type: String,
    /// The GPUs it asks admission for: of a MIG job, those that hold its instances.
    pub gpus: i64,
    /// Seconds since the trace's start.
    pub submit: i64,
    pub duration: i64,
    /// The fraction (0 to 1) of its asked GPUs it keeps busy; None: not reported.
    pub used: Option<f64>,
    /// The MIG instances it asks for; None: whole GPUs.
    pub mig: Option<Slices>,
}

impl Job {
    /// What it asks for in GPUs: its GPUs, or the part of GPUs its MIG instances fill.
    pub fn demand_gpus(&self) -> f64 {
        self.mig
            .as_ref()
            .map_or(self.gpus as f64, Slices::gpu_equivalent)
    }

    /// Its GPUs busy on average: what it asks for times the used fraction, all of it
    /// when the trace does not say.
    pub fn busy_gpus(&self) -> f64 {
        self.demand_gpus() * self.used.unwrap_or(1.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    Simple,
    Alibaba,
}

/// A trace as read: its jobs in file order, and what was left out of it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Trace {
    pub layout: Layout,
    #[serde(skip)]
    pub jobs: Vec<Job>,
    pub rows: usize,
    /// Alibaba rows without GPUs.
    pub skipped_without_gpus: usize,
    /// Alibaba rows that never ran (no scheduled or deletion time, or none after it).
    pub skipped_never_ran: usize,
    /// Alibaba GPU-sharing rows, each given a whole GPU.
    pub shared_gpu_rounded_up: usize,
    /// Alibaba GPU-sharing rows given a MIG instance per GPU instead.
    pub shared_gpu_as_mig: usize,
    /// Jobs that ask for MIG instances.
    pub mig_jobs: usize,
    /// Jobs that report the fraction of their GPUs they use.
    pub used_reported: usize,
}

pub fn load(file: &Path, fleet: &Fleet) -> Result<Trace, Refusal> {
    parse(file, &read_bounded(file, MAX_BYTES)?, fleet)
}

pub fn parse(file: &Path, text: &str, fleet: &Fleet) -> Result<Trace, Refusal> {
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
    let Some((_, header)) = lines.next() else {
        return Err(Refusal::at(file, 1, 1, "empty trace: no header line"));
    };
    let header = csv::fields(header).map_err(|c| Refusal::at(file, 1, c, "unclosed quote"))?;
    let mut reader: Box<dyn RowReader> = if let Some(simple) = Simple::from_header(&header) {
        Box::new(simple)
    } else if let Some(alibaba) = Alibaba::from_header(&header) {
        Box::new(alibaba)
    } else {
        return Err(Refusal::at(
            file,
            1,
            1,
            format!(
                "header: expected `{}` (then optionally `{USED_COLUMN}` and `{MIG_COLUMN}`, each once) or a pod list of cluster-trace-gpu-v2023 with columns {}",
                SIMPLE_COLUMNS.join(","),
                ALIBABA_COLUMNS.join(",")
            ),
        ));
    };
    let mut trace = Trace {
        layout: reader.layout(),
        jobs: Vec::new(),
        rows: 0,
        skipped_without_gpus: 0,
        skipped_never_ran: 0,
        shared_gpu_rounded_up: 0,
        shared_gpu_as_mig: 0,
        mig_jobs: 0,
        used_reported: 0,
    };
    for (line, text) in lines {
        if text.trim().is_empty() {
            continue;
        }
        trace.rows += 1;
        if trace.rows > MAX_ROWS {
            return Err(Refusal::at(
                file,
                line,
                1,
                format!("more than {MAX_ROWS} rows"),
            ));
        }
        let fields = csv::fields(text).map_err(|c| Refusal::at(file, line, c, "unclosed quote"))?;
        if fields.len() != header.len() {
            return Err(Refusal::at(
                file,
                line,
                fields.len().min(header.len()) + 1,
                format!("{} fields, the header has {}", fields.len(), header.len()),
            ));
        }
        let row = Row {
            file,
            line,
            fields: &fields,
        };
        if let Some(job) = reader.job(&row, fleet, &mut trace)? {
            check_quota(
                &row,
                reader.team_column(),
                reader.model_column(),
                &job,
                fleet,
            )?;
            trace.used_reported += usize::from(job.used.is_some());
            trace.mig_jobs += usize::from(job.mig.is_some());
            trace.jobs.push(job);
        }
    }
    reader.finish(&mut trace);
    Ok(trace)
}

/// A job's team must have a quota for its model: without one the control plane refuses
/// it for ever.
fn check_quota(
    row: &Row,
    team_column: usize,
    model_column: usize,
    job: &Job,
    fleet: &Fleet,
) -> Result<(), Refusal> {
    let team = &fleet.teams[job.team];
    if team.quota(&job.gpu_type).is_some() {
        return Ok(());
    }
    let column = if fleet.model(&job.gpu_type).is_none() {
        model_column
    } else {
        team_column
    };
    Err(row.refuse(
        column,
        format!(
            "team '{}' has no quota for {} in the fleet description",
            team.name, job.gpu_type
        ),
    ))
}

struct Row<'a> {
    file: &'a Path,
    line: usize,
    fields: &'a [String],
}

impl Row<'_> {
    fn refuse(&self, column: usize, message: String) -> Refusal {
        Refusal::at(self.file, self.line, column + 1, message)
    }

    fn integer(&self, column: usize, name: &str) -> Result<i64, Refusal> {
        self.fields[column].parse().map_err(|_| {
            self.refuse(
                column,
                format!(
                    "{name}: not a whole number ('{}')",
                    cut(&self.fields[column])
                ),
            )
        })
    }
}

/// At most 40 characters of a value in a message.
fn cut(value: &str) -> String {
    value.chars().take(40).collect()
}

trait RowReader {
    fn layout(&self) -> Layout;
    /// The row's job, or None when the layout leaves it out (counted in `trace`).
    fn job(&mut self, row: &Row, fleet: &Fleet, trace: &mut Trace) -> Result<Option<Job>, Refusal>;
    fn team_column(&self) -> usize;
    fn model_column(&self) -> usize;
    fn finish(&self, _trace: &mut Trace) {}
}

/// Where the simple layout's optional columns are.
struct Simple {
    used: Option<usize>,
    mig_profile: Option<usize>,
}

impl Simple {
    /// The five columns, then `used` and `mig_profile` in any order, each at most once.
    fn from_header(header: &[String]) -> Option<Self> {
        if !header.starts_with(&SIMPLE_COLUMNS.map(String::from)) {
            return None;
        }
        let mut simple = Self {
            used: None,
            mig_profile: None,
        };
        for (i, name) in header.iter().enumerate().skip(SIMPLE_COLUMNS.len()) {
            let slot = match name.as_str() {
                USED_COLUMN => &mut simple.used,
                MIG_COLUMN => &mut simple.mig_profile,
                _ => return None,
            };
            if slot.replace(i).is_some() {
                return None;
            }
        }
        Some(simple)
    }
}

impl RowReader for Simple {
    fn layout(&self) -> Layout {
        Layout::Simple
    }

    fn job(&mut self, row: &Row, fleet: &Fleet, _: &mut Trace) -> Result<Option<Job>, Refusal> {
        let f = row.fields;
        let team = fleet.team_index(&f[0]).ok_or_else(|| {
            row.refuse(
                0,
                format!("team: '{}' is not a team of the fleet", cut(&f[0])),
            )
        })?;
        if fleet.model(&f[1]).is_none() {
            return Err(row.refuse(
                1,
                format!("gpu_type: the fleet has no '{}' nodes", cut(&f[1])),
            ));
        }
        let gpus = row.integer(2, "gpus")?;
        if !(1..=MAX_GPUS).contains(&gpus) {
            return Err(row.refuse(2, format!("gpus: 1 to {MAX_GPUS} (got {gpus})")));
        }
        let submit = seconds(&f[3]).ok_or_else(|| {
            row.refuse(3, format!("submit: seconds since the trace's start, or a number with s, m, h or d (got '{}')", cut(&f[3])))
        })?;
        let duration = seconds(&f[4]).ok_or_else(|| {
            row.refuse(
                4,
                format!(
                    "duration: seconds, or a number with s, m, h or d (got '{}')",
                    cut(&f[4])
                ),
            )
        })?;
        if !(1..=MAX_DURATION).contains(&duration) {
            return Err(row.refuse(
                4,
                format!("duration: 1 s to {MAX_DURATION} s (got {duration})"),
            ));
        }
        if submit > MAX_DURATION {
            return Err(row.refuse(
                3,
                format!("submit: at most {MAX_DURATION} s into the trace (got {submit})"),
            ));
        }
        let used = match self.used.map(|c| (c, f[c].as_str())) {
            None | Some((_, "")) => None,
            Some((column, text)) => Some(
                text.parse::<f64>()
                    .ok()
                    .filter(|u| (0.0..=1.0).contains(u))
                    .ok_or_else(|| {
                        row.refuse(
                            column,
                            format!(
                                "used: the fraction of the job's GPUs it keeps busy, 0 to 1 (got '{}')",
                                cut(text)
                            ),
                        )
                    })?,
            ),
        };
        // With a profile, `gpus` counts its instances.
        let mig = match self.mig_profile.map(|c| (c, f[c].as_str())) {
            None | Some((_, "")) => None,
            Some((column, profile)) => {
                Some(Slices::ask(&f[1], profile, gpus).map_err(|m| row.refuse(column, m))?)
            }
        };
        Ok(Some(Job {
            line: row.line,
            team,
            gpu_type: f[1].clone(),
            gpus: mig.as_ref().map_or(gpus, Slices::gpus),
            submit,
            duration,
            used,
            mig,
        }))
    }

    fn team_column(&self) -> usize {
        0
    }

    fn model_column(&self) -> usize {
        1
    }
}

/// `90`, `90s`, `15m`, `2h`, `1d`: whole seconds, at least 0.
fn seconds(text: &str) -> Option<i64> {
    let (number, unit) = match text.char_indices().last()? {
        (i, 's') => (&text[..i], 1),
        (i, 'm') => (&text[..i], 60),
        (i, 'h') => (&text[..i], 3_600),
        (i, 'd') => (&text[..i], 86_400),
        _ => (text, 1),
    };
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    number.parse::<i64>().ok()?.checked_mul(unit)
}

/// Where each column Alibaba's reader uses sits in the header.
struct Alibaba {
    name: usize,
    num_gpu: usize,
    gpu_milli: usize,
    gpu_spec: usize,
    creation: usize,
    deletion: usize,
    scheduled: usize,
    /// The earliest creation time seen: submit times are relative to it.
    first_creation: Option<i64>,
}

impl Alibaba {
    fn from_header(header: &[String]) -> Option<Self> {
        let at = |name: &str| header.iter().position(|h| h == name);
        ALIBABA_COLUMNS
            .iter()
            .all(|c| at(c).is_some())
            .then(|| Self {
                name: at("name").expect("checked"),
                num_gpu: at("num_gpu").expect("checked"),
                gpu_milli: at("gpu_milli").expect("checked"),
                gpu_spec: at("gpu_spec").expect("checked"),
                creation: at("creation_time").expect("checked"),
                deletion: at("deletion_time").expect("checked"),
                scheduled: at("scheduled_time").expect("checked"),
                first_creation: None,
            })
    }

    /// A time column: empty (or pandas' `nan`) is None.
    fn time(row: &Row, column: usize, name: &str) -> Result<Option<i64>, Refusal> {
        let text = row.fields[column].as_str();
        if text.is_empty() || text == "nan" {
            return Ok(None);
        }
        // pandas may write whole numbers as `123.0`.
        let whole = text.strip_suffix(".0").unwrap_or(text);
        match whole.parse::<i64>() {
            Ok(t) if t >= 0 => Ok(Some(t)),
            _ => Err(row.refuse(
                column,
                format!("{name}: not whole seconds ('{}')", cut(text)),
            )),
        }
    }

    fn model(&self, row: &Row, fleet: &Fleet) -> Result<String, Refusal> {
        let spec = row.fields[self.gpu_spec].as_str();
        if spec.is_empty() || spec == "nan" {
            return Ok(fleet.alibaba.default_gpu_type.clone());
        }
        spec.split('|')
            .find_map(|s| fleet.alibaba.by_spec.get(s.trim()))
            .cloned()
            .ok_or_else(|| {
                row.refuse(
                    self.gpu_spec,
                    format!(
                        "gpu_spec: '{}' names no model of the fleet; map it in the fleet description's [alibaba] gpu_spec table",
                        cut(spec)
                    ),
                )
            })
    }
}

/// FNV-1a, 64 bits: a stable hash (std's is seeded per process).
pub fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl RowReader for Alibaba {
    fn layout(&self) -> Layout {
        Layout::Alibaba
    }

    fn job(&mut self, row: &Row, fleet: &Fleet, trace: &mut Trace) -> Result<Option<Job>, Refusal> {
        let num_gpu = row.integer(self.num_gpu, "num_gpu")?;
        if !(0..=MAX_GPUS).contains(&num_gpu) {
            return Err(row.refuse(
                self.num_gpu,
                format!("num_gpu: 0 to {MAX_GPUS} (got {num_gpu})"),
            ));
        }
        let creation = Self::time(row, self.creation, "creation_time")?
            .ok_or_else(|| row.refuse(self.creation, "creation_time: missing".into()))?;
        let scheduled = Self::time(row, self.scheduled, "scheduled_time")?;
        let deletion = Self::time(row, self.deletion, "deletion_time")?;
        if num_gpu == 0 {
            trace.skipped_without_gpus += 1;
            return Ok(None);
        }
        let milli = row.integer(self.gpu_milli, "gpu_milli")?;
        if !(0..=1000).contains(&milli) {
            return Err(row.refuse(
                self.gpu_milli,
                format!("gpu_milli: 0 to 1000 (got {milli})"),
            ));
        }
        let (Some(scheduled), Some(deletion)) = (scheduled, deletion) else {
            trace.skipped_never_ran += 1;
            return Ok(None);
        };
        let duration = deletion - scheduled;
        if duration <= 0 {
            trace.skipped_never_ran += 1;
            return Ok(None);
        }
        if duration > MAX_DURATION {
            return Err(row.refuse(
                self.deletion,
                format!("deletion_time: the pod ran {duration} s, more than {MAX_DURATION}"),
            ));
        }
        let gpu_type = self.model(row, fleet)?;
        let mig = match mig::profile_for_share(&gpu_type, milli) {
            Some(profile) if milli < 1000 && fleet.alibaba.gpu_milli_as_mig => Some(
                Slices::ask(&gpu_type, &profile, num_gpu)
                    .map_err(|m| row.refuse(self.gpu_milli, m))?,
            ),
            _ => None,
        };
        if mig.is_some() {
            trace.shared_gpu_as_mig += 1;
        } else if milli < 1000 {
            trace.shared_gpu_rounded_up += 1;
        }
        self.first_creation = Some(self.first_creation.map_or(creation, |f| f.min(creation)));
        let team = (fnv1a(&row.fields[self.name]) % fleet.teams.len() as u64) as usize;
        Ok(Some(Job {
            line: row.line,
            team,
            gpu_type,
            gpus: mig.as_ref().map_or(num_gpu, Slices::gpus),
            // Made relative in finish(), once the first creation is known.
            submit: creation,
            duration,
            // The pod list says what a pod asked for, not how busy it kept its GPUs.
            used: None,
            mig,
        }))
    }

    fn team_column(&self) -> usize {
        self.name
    }

    fn model_column(&self) -> usize {
        self.gpu_spec
    }

    fn finish(&self, trace: &mut Trace) {
        let first = self.first_creation.unwrap_or(0);
        for job in &mut trace.jobs {
            job.submit -= first;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet;

    fn fleet() -> Fleet {
        fleet::parse(
            Path::new("fleet.toml"),
            r#"
[[pool]]
gpu_type = "H100-80GB"
nodes = 4
[[pool]]
gpu_type = "A100-80GB"
nodes = 1
[[pool]]
gpu_type = "H200-141GB"
nodes = 1
[[team]]
name = "vision"
quota = [{ gpu_type = "H100-80GB", gpus = 16 }, { gpu_type = "A100-80GB", gpus = 0, burst_gpus = 8 }]
[[team]]
name = "nlp"
quota = [{ gpu_type = "H100-80GB", gpus = 16 }, { gpu_type = "A100-80GB", gpus = 8 }, { gpu_type = "H200-141GB", gpus = 8 }]
[alibaba]
gpu_spec = { V100M32 = "A100-80GB" }
"#,
        )
        .unwrap()
    }

    fn refused(text: &str) -> String {
        parse(Path::new("trace.csv"), text, &fleet())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn simple_rows_become_jobs() {
        let trace = parse(
            Path::new("trace.csv"),
            "team,gpu_type,gpus,submit,duration\nvision,H100-80GB,8,0,1h\n\nnlp,A100-80GB,3,90m,45\n",
            &fleet(),
        )
        .unwrap();
        assert_eq!(trace.layout, Layout::Simple);
        assert_eq!(
            trace.jobs,
            [
                Job {
                    line: 2,
                    team: 0,
                    gpu_type: "H100-80GB".into(),
                    gpus: 8,
                    submit: 0,
                    duration: 3600,
                    used: None,
                    mig: None,
                },
                Job {
                    line: 4,
                    team: 1,
                    gpu_type: "A100-80GB".into(),
                    gpus: 3,
                    submit: 5400,
                    duration: 45,
                    used: None,
                    mig: None,
                },
            ]
        );
    }

    #[test]
    fn malformed_simple_rows_name_line_and_column() {
        let h = "team,gpu_type,gpus,submit,duration\n";
        assert!(refused("team,gpus\n")
            .starts_with("trace.csv:1:1: header: expected `team,gpu_type,gpus,submit,duration`"));
        assert_eq!(refused(""), "trace.csv:1:1: empty trace: no header line");
        assert_eq!(
            refused(&format!("{h}vision,H100-80GB,8,0\n")),
            "trace.csv:2:5: 4 fields, the header has 5"
        );
        assert_eq!(
            refused(&format!(
                "{h}vision,H100-80GB,8,0,1h\nops,H100-80GB,8,0,1h\n"
            )),
            "trace.csv:3:1: team: 'ops' is not a team of the fleet"
        );
        assert_eq!(
            refused(&format!("{h}vision,B200,8,0,1h\n")),
            "trace.csv:2:2: gpu_type: the fleet has no 'B200' nodes"
        );
        assert_eq!(
            refused(&format!("{h}vision,H100-80GB,eight,0,1h\n")),
            "trace.csv:2:3: gpus: not a whole number ('eight')"
        );
        assert_eq!(
            refused(&format!("{h}vision,H100-80GB,0,0,1h\n")),
            "trace.csv:2:3: gpus: 1 to 100000 (got 0)"
        );
        assert!(refused(&format!("{h}vision,H100-80GB,8,-5,1h\n"))
            .starts_with("trace.csv:2:4: submit: seconds since"));
        assert!(refused(&format!("{h}vision,H100-80GB,8,0,1w\n"))
            .starts_with("trace.csv:2:5: duration: seconds"));
        assert_eq!(
            refused(&format!("{h}vision,H100-80GB,8,0,0\n")),
            "trace.csv:2:5: duration: 1 s to 316224000 s (got 0)"
        );
        assert_eq!(
            refused(&format!("{h}vision,H200-141GB,8,0,1h\n")),
            "trace.csv:2:1: team 'vision' has no quota for H200-141GB in the fleet description"
        );
        assert_eq!(
            refused(&format!("{h}vision,\"H100,0,1h\n")),
            "trace.csv:2:2: unclosed quote"
        );
    }

    #[test]
    fn a_used_column_says_how_busy_each_job_keeps_its_gpus() {
        let h = "team,gpu_type,gpus,submit,duration,used\n";
        let trace = parse(
            Path::new("trace.csv"),
            &format!("{h}vision,H100-80GB,8,0,1h,0.25\nnlp,H100-80GB,2,0,1h,\n"),
            &fleet(),
        )
        .unwrap();
        assert_eq!(trace.jobs[0].used, Some(0.25));
        assert_eq!(trace.jobs[0].busy_gpus(), 2.0);
        // Not reported: every asked GPU counts as busy.
        assert_eq!((trace.jobs[1].used, trace.jobs[1].busy_gpus()), (None, 2.0));
        assert_eq!(trace.used_reported, 1);
        assert_eq!(
            refused(&format!("{h}vision,H100-80GB,8,0,1h,1.5\n")),
            "trace.csv:2:6: used: the fraction of the job's GPUs it keeps busy, 0 to 1 (got '1.5')"
        );
        assert_eq!(
            refused(&format!("{h}vision,H100-80GB,8,0,1h,busy\n")),
            "trace.csv:2:6: used: the fraction of the job's GPUs it keeps busy, 0 to 1 (got 'busy')"
        );
        assert_eq!(
            refused(&format!("{h}vision,H100-80GB,8,0,1h\n")),
            "trace.csv:2:6: 5 fields, the header has 6"
        );
    }

    /// With a `mig_profile`, `gpus` counts instances of it; the job asks admission for
    /// the GPUs that hold them (7 1g.10gb fit an H100: 9 take 2 GPUs). The optional
    /// columns come in either order; old traces without them still load (above).
    #[test]
    fn a_mig_profile_column_asks_for_slices() {
        let h = "team,gpu_type,gpus,submit,duration,mig_profile,used\n";
        let trace = parse(
            Path::new("trace.csv"),
            &format!("{h}vision,H100-80GB,9,0,1h,1g.10gb,0.5\nnlp,H100-80GB,8,0,1h,,\n"),
            &fleet(),
        )
        .unwrap();
        let mig = trace.jobs[0].mig.as_ref().unwrap();
        assert_eq!(
            (
                mig.profile.as_str(),
                mig.count,
                mig.per_gpu,
                trace.jobs[0].gpus
            ),
            ("1g.10gb", 9, 7, 2)
        );
        assert!((trace.jobs[0].busy_gpus() - 9.0 / 7.0 * 0.5).abs() < 1e-12);
        assert_eq!((trace.jobs[1].mig.as_ref(), trace.jobs[1].gpus), (None, 8));
        assert_eq!((trace.mig_jobs, trace.used_reported), (1, 1));
    }

    #[test]
    fn a_malformed_mig_profile_is_refused_naming_line_and_column() {
        let h = "team,gpu_type,gpus,submit,duration,mig_profile\n";
        let e = refused(&format!(
            "{h}vision,H100-80GB,8,0,1h,\nvision,H100-80GB,2,0,1h,1g.5gb\n"
        ));
        assert!(
            e.starts_with("trace.csv:3:6: mig_profile: '1g.5gb' is not a MIG profile of H100-80GB (its profiles: 1g.10gb, "),
            "{e}"
        );
        // Each model its own names: the A100-80GB's 1g is 1g.10gb, the H200's 1g.18gb.
        assert!(
            refused(&format!("{h}nlp,H200-141GB,2,0,1h,1g.10gb\n")).starts_with(
                "trace.csv:2:6: mig_profile: '1g.10gb' is not a MIG profile of H200-141GB"
            )
        );
        assert_eq!(
            refused(&format!("{h}vision,H100-80GB,0,0,1h,1g.10gb\n")),
            "trace.csv:2:3: gpus: 1 to 100000 (got 0)"
        );
        assert!(
            refused("team,gpu_type,gpus,submit,duration,mig_profile,mig_profile\n")
                .starts_with("trace.csv:1:1: header: expected `team,gpu_type,gpus,submit,duration` (then optionally `used` and `mig_profile`, each once)")
        );
    }

    const ALIBABA_HEADER: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n";

    #[test]
    fn alibaba_rows_become_jobs_of_hashed_teams() {
        let text = format!(
            "{ALIBABA_HEADER}\
openb-pod-0017,88000,327680,8,1000,,Burstable,Succeeded,9437497,10769854,9437497
openb-pod-0022,4000,15258,1,220,nan,BE,Running,9679175,9973826,9679175
openb-pod-0035,16000,32768,1,1000,V100M16|V100M32,LS,Running,9967058,9968575,9967063
openb-pod-0040,1000,1024,0,0,,BE,Succeeded,9967058,9968575,9967063
openb-pod-0041,1000,1024,2,1000,,LS,Pending,9967058,,
"
        );
        let trace = parse(Path::new("pods.csv"), &text, &fleet()).unwrap();
        assert_eq!(trace.layout, Layout::Alibaba);
        assert_eq!(
            (
                trace.rows,
                trace.skipped_without_gpus,
                trace.skipped_never_ran,
                trace.shared_gpu_rounded_up
            ),
            (5, 1, 1, 1)
        );
        let team = |name: &str| (fnv1a(name) % 2) as usize;
        let pods: Vec<(usize, &str, i64, i64, i64)> = trace
            .jobs
            .iter()
            .map(|j| (j.team, j.gpu_type.as_str(), j.gpus, j.submit, j.duration))
            .collect();
        assert_eq!(
            pods,
            [
                (
                    team("openb-pod-0017"),
                    "H100-80GB",
                    8,
                    0,
                    10769854 - 9437497
                ),
                (
                    team("openb-pod-0022"),
                    "H100-80GB",
                    1,
                    9679175 - 9437497,
                    9973826 - 9679175
                ),
                (
                    team("openb-pod-0035"),
                    "A100-80GB",
                    1,
                    9967058 - 9437497,
                    9968575 - 9967063
                ),
            ]
        );
        // The FNV-1a test vector: the hash is the documented one.
        assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c);
    }

    /// With `gpu_milli_as_mig`, a GPU-sharing pod on a MIG model takes the smallest
    /// instance covering its share per GPU (220 thousandths: 2 of 7 compute slices, a
    /// 2g.20gb; one GPU holds 3 of them); a whole-GPU pod is unchanged.
    #[test]
    fn alibaba_gpu_shares_become_mig_instances_where_the_fleet_asks() {
        let mut fleet = fleet();
        fleet.alibaba.gpu_milli_as_mig = true;
        let text = format!(
            "{ALIBABA_HEADER}\
p1,1,1,1,220,,BE,Running,100,200,100
p2,1,1,2,1000,,LS,Running,100,200,100
"
        );
        let trace = parse(Path::new("pods.csv"), &text, &fleet).unwrap();
        let mig = trace.jobs[0].mig.as_ref().unwrap();
        assert_eq!(
            (mig.profile.as_str(), mig.count, trace.jobs[0].gpus),
            ("2g.20gb", 1, 1)
        );
        assert!((trace.jobs[0].demand_gpus() - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!((trace.jobs[1].mig.as_ref(), trace.jobs[1].gpus), (None, 2));
        assert_eq!(
            (trace.shared_gpu_as_mig, trace.shared_gpu_rounded_up),
            (1, 0)
        );
    }

    #[test]
    fn malformed_alibaba_rows_name_line_and_column() {
        let fleet = fleet();
        let refused = |row: &str| {
            parse(
                Path::new("pods.csv"),
                &format!("{ALIBABA_HEADER}{row}\n"),
                &fleet,
            )
            .unwrap_err()
            .to_string()
        };
        assert_eq!(
            refused("p,1,1,two,1000,,LS,Running,1,2,1"),
            "pods.csv:2:4: num_gpu: not a whole number ('two')"
        );
        assert_eq!(
            refused("p,1,1,1,1000,,LS,Running,soon,2,1"),
            "pods.csv:2:9: creation_time: not whole seconds ('soon')"
        );
        assert_eq!(
            refused("p,1,1,1,1500,,LS,Running,1,2,1"),
            "pods.csv:2:5: gpu_milli: 0 to 1000 (got 1500)"
        );
        assert!(refused("p,1,1,1,1000,T4,LS,Running,1,2,1")
            .starts_with("pods.csv:2:6: gpu_spec: 'T4' names no model of the fleet"));
    }
}
