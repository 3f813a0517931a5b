//! What a Slurm controller says about its nodes (`sinfo`) and its jobs (`squeue`), and the
//! Slurm commands the control plane runs against it (`scontrol`), each bounded in time.
//! Blocking.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One node as the controller sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeState {
    /// e.g. "idle", "allocated", "mixed", "drained", "down*", "unknown".
    pub state: String,
    /// e.g. "gpu:3g.40gb:16".
    pub gres: String,
    /// Why it is down or drained ("none" when it is not).
    pub reason: String,
}

impl NodeState {
    /// Ready for jobs: idle, running jobs, or partly so (never drained or not responding).
    pub fn schedulable(&self) -> bool {
        matches!(
            self.state.as_str(),
            "idle" | "allocated" | "mixed" | "completing"
        )
    }
}

/// Runs a Slurm client command against the cluster of `conf`, killed after `limit`.
pub fn run(program: &str, args: &[&str], conf: &Path, limit: Duration) -> Result<String, String> {
    let mut child = Command::new(program)
        .args(args)
        .env("SLURM_CONF", conf)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{program} did not answer within {limit:?}"));
            }
            Err(e) => return Err(format!("{program}: {e}")),
        }
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    if !status.success() {
        return Err(format!("{program} {}: {}", args.join(" "), err.trim()));
    }
    Ok(out)
}

/// The controller's next job id (`NEXT_JOB_ID` of `scontrol show config`), if it answers.
pub fn next_job_id(conf: &Path) -> Option<u64> {
    let out = run(
        "scontrol",
        &["show", "config"],
        conf,
        Duration::from_secs(10),
    )
    .ok()?;
    parse_next_job_id(&out)
}

fn parse_next_job_id(config: &str) -> Option<u64> {
    config.lines().find_map(|l| {
        let (key, value) = l.split_once('=')?;
        (key.trim() == "NEXT_JOB_ID").then(|| value.trim().parse().ok())?
    })
}

/// `sinfo -N` output as node -> state.
pub fn parse_sinfo(text: &str) -> BTreeMap<String, NodeState> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut parts = line.splitn(4, '|');
        let (Some(name), Some(state), Some(gres), Some(reason)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        out.insert(
            name.trim().to_string(),
            NodeState {
                state: state.trim().to_string(),
                gres: gres.trim().to_string(),
                reason: reason.trim().to_string(),
            },
        );
    }
    out
}

/// The controller's view of its nodes; an error when the controller does not answer.
pub fn nodes(conf: &Path) -> Result<BTreeMap<String, NodeState>, String> {
    // Short limits: a controller that does not answer within them is not "ready".
    let text = run(
        "sinfo",
        &["-h", "-N", "-o", "%N|%T|%G|%E"],
        conf,
        Duration::from_secs(10),
    )?;
    Ok(parse_sinfo(&text))
}

/// The jobs a controller holds that are running or waiting, and those it is still ending.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobCounts {
    pub running: u64,
    pub pending: u64,
    /// Ending (`COMPLETING`: the nodes have not all said their part ended) or being put
    /// back in the queue (`REQUEUED`): a requeued job is pending again once none of it is
    /// left on its nodes.
    pub ending: u64,
}

impl JobCounts {
    /// Counts one `squeue -o %T` line (a job's state).
    fn add(&mut self, line: &str) {
        match line.trim() {
            "RUNNING" => self.running += 1,
            "PENDING" => self.pending += 1,
            "COMPLETING" | "REQUEUED" => self.ending += 1,
            _ => {}
        }
    }
}

/// `squeue -h -o %T` output as counts.
pub fn parse_squeue_states(text: &str) -> JobCounts {
    let mut counts = JobCounts::default();
    text.lines().for_each(|l| counts.add(l));
    counts
}

/// The controller's running, pending and ending jobs (every user's: the cluster is one team's),
/// counted as `squeue` prints them, one line per job, read while it prints (a queue of
/// any length), killed after 10 s.
pub fn jobs(conf: &Path) -> Result<JobCounts, String> {
    use std::io::BufRead;
    let limit = Duration::from_secs(10);
    let mut child = Command::new("squeue")
        .args(["-h", "-a", "-t", "PENDING,RUNNING,COMPLETING,REQUEUED"])
        .args(["-o", "%T"])
        .env("SLURM_CONF", conf)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run squeue: {e}"))?;
    let out = child.stdout.take().ok_or("squeue: no output pipe")?;
    let counting = std::thread::spawn(move || {
        let mut counts = JobCounts::default();
        for line in std::io::BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            counts.add(&line);
        }
        counts
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = counting.join();
                return Err(format!("squeue did not answer within {limit:?}"));
            }
            Err(e) => return Err(format!("squeue: {e}")),
        }
    };
    let counts = counting
        .join()
        .map_err(|_| "squeue: the reader failed".to_string())?;
    if !status.success() {
        return Err(format!("squeue failed ({status})"));
    }
    Ok(counts)
}

/// Why the cluster is not ready, or None when every expected node is schedulable.
pub fn not_ready(expected: &[String], seen: &BTreeMap<String, NodeState>) -> Option<String> {
    let mut why = Vec::new();
    for name in expected {
        match seen.get(name) {
            Some(s) if s.schedulable() => {}
            Some(s) if s.reason.is_empty() || s.reason == "none" => {
                why.push(format!("{name} is {}", s.state))
            }
            Some(s) => why.push(format!("{name} is {} ({})", s.state, s.reason)),
            None => why.push(format!("{name} is not known to the controller")),
        }
    }
    (!why.is_empty()).then(|| format!("Slurm: {}", why.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_job_id_is_read_from_the_controllers_config() {
        let shown = "Configuration data as of 2026-12-06T02:00:00\nMpiParams               = (null)\nNEXT_JOB_ID             = 4711\nNodeFeaturesPlugins     = (null)\n";
        assert_eq!(parse_next_job_id(shown), Some(4711));
        assert_eq!(parse_next_job_id("NEXT_JOB_ID = soon\n"), None);
        assert_eq!(parse_next_job_id("MaxJobId = 67043328\n"), None);
    }

    #[test]
    fn squeue_states_count_running_pending_and_ending() {
        let c = parse_squeue_states(
            "RUNNING\nPENDING\nPENDING\nCOMPLETING\nREQUEUED\nCOMPLETED\n\n RUNNING \n",
        );
        assert_eq!(
            c,
            JobCounts {
                running: 2,
                pending: 2,
                ending: 2,
            }
        );
    }

    #[test]
    fn sinfo_lines_parse_and_unready_nodes_are_named() {
        let seen = parse_sinfo(
            "a|idle|gpu:3g.40gb:16|none\nb|drained|gpu:3g.40gb:16|gpufleet: driver change\nc|down*|gpu:h100:8|Not responding\n",
        );
        assert!(seen["a"].schedulable());
        assert!(!seen["b"].schedulable());
        let names: Vec<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
        assert_eq!(
            not_ready(&names, &seen).unwrap(),
            "Slurm: b is drained (gpufleet: driver change); c is down* (Not responding); d is not known to the controller"
        );
        assert_eq!(not_ready(&names[..1], &seen), None);
    }
}
