//! The control plane's questions to a cluster's controller, asked from this node with its
//! own slurm.conf (which names the cluster's controllers) and munged: `sinfo` and `squeue`
//! for what the controller says of its nodes and jobs, `scontrol update` to drain or
//! resume nodes, `scontrol reconfigure` to have every slurmd register again. As root, the
//! Slurm administrator of the cluster (`SlurmUser`). Each command is bounded in time.

use std::path::Path;
use std::time::Duration;

use gpufleet_proto::v1;
use gpufleet_slurm::status;

/// At most this many nodes per drain or resume.
const MAX_NODES: usize = 4096;

/// Runs `q` against the cluster of `conf`; every action answers with the status after it.
pub fn run(conf: &Path, q: &v1::SlurmQuery) -> Result<v1::SlurmAnswer, String> {
    match q.action.as_str() {
        "status" => {}
        "drain" | "resume" => {
            if q.nodes.is_empty() || q.nodes.len() > MAX_NODES {
                return Err(format!("nodes: {} names (1 to {MAX_NODES})", q.nodes.len()));
            }
            for node in &q.nodes {
                if !node_name(node) {
                    return Err(format!("nodes: {node:?} is not a node name"));
                }
            }
            if q.reason.len() > 256 || q.reason.chars().any(char::is_control) {
                return Err("reason: at most 256 characters on one line".into());
            }
            let state = match q.action.as_str() {
                "drain" => "state=drain".to_string(),
                _ => "state=resume".to_string(),
            };
            let reason = format!("reason={}", q.reason);
            let mut args = vec![
                "update".to_string(),
                format!("nodename={}", q.nodes.join(",")),
            ];
            args.push(state);
            if q.action == "drain" {
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
                "action: {other:?} is not one of status, drain, resume, reconfigure"
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
    })
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
            )
            .unwrap_err()
        };
        assert!(ask("shutdown", &[], "").starts_with("action: \"shutdown\""));
        assert!(ask("drain", &[], "x").starts_with("nodes: 0 names"));
        assert!(ask("drain", &["a state=down"], "x").contains("not a node name"));
        assert!(ask("drain", &["a"], "two\nlines").starts_with("reason:"));
        assert!(node_name("gpu-a.example_1"));
    }
}
