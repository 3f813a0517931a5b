//! The control plane's questions to a cluster's controller, asked from this node with its
//! own slurm.conf (which names the cluster's controllers) and munged: `sinfo` and `squeue`
//! for what the controller says of its nodes and jobs, `scontrol update` to drain, resume
//! or set down nodes, `scontrol reconfigure` to have every slurmd register again (as root, the
//! Slurm administrator of the cluster, `SlurmUser`); and a probe of what makes the cluster
//! usable: a job step on every node, run as the cluster's account (`srun`), and the login
//! answering. Each command is bounded in time.

use std::path::Path;
use std::time::Duration;

use gpufleet_proto::v1;
use gpufleet_slurm::status;

/// At most this many nodes per drain or resume.
const MAX_NODES: usize = 4096;

/// What a probe needs beyond the query: the cluster's account, and the login this node
/// runs for the cluster (its address and port), if it runs one.
pub struct ProbeWith {
    pub uid: u32,
    pub login: Option<std::net::SocketAddr>,
}

/// The query's node names, checked.
fn checked_nodes(q: &v1::SlurmQuery) -> Result<(), String> {
    if q.nodes.is_empty() || q.nodes.len() > MAX_NODES {
        return Err(format!("nodes: {} names (1 to {MAX_NODES})", q.nodes.len()));
    }
    for node in &q.nodes {
        if !node_name(node) {
            return Err(format!("nodes: {node:?} is not a node name"));
        }
    }
    Ok(())
}

/// Runs `q` against the cluster of `conf` (`probe`: how to probe, for a probe); every
/// action answers with the status after it.
pub fn run(
    conf: &Path,
    q: &v1::SlurmQuery,
    probe: Option<ProbeWith>,
) -> Result<v1::SlurmAnswer, String> {
    let mut probed = String::new();
    match q.action.as_str() {
        "status" => {}
        "probe" => {
            checked_nodes(q)?;
            let with = probe.ok_or("probe: this node cannot probe the cluster")?;
            probed = step_everywhere(conf, with.uid, &q.nodes)?;
            if let Some(at) = with.login {
                login_answers(at)?;
            }
        }
        "drain" | "resume" | "down" => {
            checked_nodes(q)?;
            if q.reason.len() > 256 || q.reason.chars().any(char::is_control) {
                return Err("reason: at most 256 characters on one line".into());
            }
            if q.action == "down" && q.reason.trim().is_empty() {
                return Err("reason: a node is set down with a reason".into());
            }
            let state = match q.action.as_str() {
                "drain" => "state=drain".to_string(),
                // As on a node failure: the controller ends the node's job steps (their
                // sruns are told) and requeues its batch jobs that may be requeued.
                "down" => "state=down".to_string(),
                _ => "state=resume".to_string(),
            };
            let reason = format!("reason={}", q.reason);
            let mut args = vec![
                "update".to_string(),
                format!("nodename={}", q.nodes.join(",")),
            ];
            args.push(state);
            if q.action != "resume" {
                args.push(reason);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            status::run("scontrol", &args, conf, Duration::from_secs(10))?;
        }
        "reconfigure" => {
            status::run("scontrol", &["reconfigure"], conf, Duration::from_secs(10))?;
        }
        other => {
            return Err(format!(
                "action: {other:?} is not one of status, drain, resume, down, reconfigure, probe"
            ))
        }
    }
    let nodes = status::nodes(conf)?;
    let jobs = status::jobs(conf);
    Ok(v1::SlurmAnswer {
        nodes: nodes
            .into_iter()
            .map(|(name, s)| v1::SlurmNodeState {
                name,
                state: s.state,
                gres: s.gres,
                reason: s.reason,
            })
            .collect(),
        jobs_known: jobs.is_ok(),
        jobs_running: jobs.as_ref().map_or(0, |j| j.running),
        jobs_pending: jobs.as_ref().map_or(0, |j| j.pending),
        jobs_ending: jobs.as_ref().map_or(0, |j| j.ending),
        probe: probed,
        next_job_id: status::next_job_id(conf).unwrap_or(0),
        // Read by the caller, which knows whether this node runs the controller.
        orphans: Vec::new(),
    })
}

/// How long a probe's step may take.
const STEP_WITHIN: Duration = Duration::from_secs(40);

/// One job step on every node of `nodes` at once (`true`, one core and 1 MiB each), as the
/// cluster's account (uid `uid`): "ran"; or "busy: ..." when Slurm could not give it a
/// core on some node within a few seconds (the team's own jobs hold them all: the nodes
/// work); Err when the step failed (a node the controller cannot reach, a slurmd that
/// cannot start it).
fn step_everywhere(conf: &Path, uid: u32, nodes: &[String]) -> Result<String, String> {
    use std::os::unix::process::CommandExt;
    let count = nodes.len().to_string();
    let mut cmd = std::process::Command::new("srun");
    cmd.args(["-N", &count, "-n", &count, "-c", "1", "--mem=1"])
        .args(["-w", &nodes.join(","), "-t", "1", "-J", "gpufleet-probe"])
        .arg("--immediate=10")
        .arg("true")
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("SLURM_CONF", conf)
        .current_dir("/");
    // SAFETY: setgroups, setgid and setuid are async-signal-safe and change only the
    // child's own credentials, before it execs srun.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(uid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (ok, said) = bounded(&mut cmd, STEP_WITHIN)?;
    if ok {
        return Ok("ran".into());
    }
    let busy = [
        "Immediate execution impossible",
        "Requested nodes are busy",
        "Resource temporarily unavailable",
    ];
    let said = said.trim().lines().last().unwrap_or_default().to_string();
    if busy.iter().any(|b| said.contains(b)) {
        return Ok(format!("busy: {said}"));
    }
    Err(format!(
        "a job step on {} did not run: {said}",
        nodes.join(", ")
    ))
}

/// Runs `cmd` (no stdin), killed after `limit`: (success, stderr and stdout).
fn bounded(cmd: &mut std::process::Command, limit: Duration) -> Result<(bool, String), String> {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run srun: {e}"))?;
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("a job step did not end within {limit:?}"));
            }
            Err(e) => return Err(format!("srun: {e}")),
        }
    };
    let mut out = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut out);
    }
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    Ok((status.success(), out))
}

/// The login at `at` answers as an ssh server (its banner) within a few seconds.
fn login_answers(at: std::net::SocketAddr) -> Result<(), String> {
    use std::io::Read;
    let limit = Duration::from_secs(5);
    let fail = |why: String| format!("the login on {at} did not answer: {why}");
    let mut s =
        std::net::TcpStream::connect_timeout(&at, limit).map_err(|e| fail(e.to_string()))?;
    s.set_read_timeout(Some(limit))
        .map_err(|e| fail(e.to_string()))?;
    let mut banner = [0u8; 8];
    s.read_exact(&mut banner).map_err(|e| fail(e.to_string()))?;
    if !banner.starts_with(b"SSH-2.0-") {
        return Err(fail(format!(
            "it is not an ssh server ({:?})",
            String::from_utf8_lossy(&banner)
        )));
    }
    Ok(())
}

/// A Slurm node name as the control plane gives them: a host name's characters.
fn node_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_names_known_actions_and_plain_node_names_only() {
        let conf = Path::new("/nonexistent/slurm.conf");
        let ask = |action: &str, nodes: &[&str], reason: &str| {
            run(
                conf,
                &v1::SlurmQuery {
                    cluster: "gf0".into(),
                    action: action.into(),
                    nodes: nodes.iter().map(|n| n.to_string()).collect(),
                    reason: reason.into(),
                },
                None,
            )
            .unwrap_err()
        };
        assert!(ask("shutdown", &[], "").starts_with("action: \"shutdown\""));
        assert!(ask("drain", &[], "x").starts_with("nodes: 0 names"));
        assert!(ask("drain", &["a state=down"], "x").contains("not a node name"));
        assert!(ask("drain", &["a"], "two\nlines").starts_with("reason:"));
        assert!(ask("down", &[], "lost").starts_with("nodes: 0 names"));
        assert!(ask("down", &["a,b"], "lost").contains("not a node name"));
        assert!(ask("down", &["a"], " ").starts_with("reason:"));
        assert!(ask("down", &["a"], "lost\rx").starts_with("reason:"));
        assert!(ask("probe", &["a"], "").contains("cannot probe"));
        assert!(node_name("gpu-a.example_1"));
    }
}
