//! What a team's Slurm batch jobs left, for the tests of lost nodes: the lines their steps
//! write (`<job id> <restart count> <hostname>` to `$HOME/requeue.log`), the fields of
//! `scontrol -o show job`, and the controllers' logs for failure messages.

use crate::netns::Host;
use crate::NodeAgent;

/// What the jobs' steps wrote to `home`'s `requeue.log` as `host` sees it: (job id,
/// restart count, hostname) per line.
pub fn written(host: &Host, home: &str) -> Vec<(String, String, String)> {
    let out = host.run("cat", &[&format!("{home}/requeue.log")]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((
                w.next()?.to_string(),
                w.next()?.to_string(),
                w.next()?.to_string(),
            ))
        })
        .collect()
}

/// `Key=value` of one `scontrol -o show job` line.
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// The last lines of each controller's log (`slurmctld.log`) under `agent`'s data dir,
/// for failure messages.
pub fn controller_log(agent: &NodeAgent) -> String {
    let found = std::process::Command::new("find")
        .arg(agent.data_dir())
        .args(["-name", "slurmctld.log"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    let mut out = String::new();
    for log in found.lines() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        out += &format!(
            "{log}:\n{}\n",
            lines[lines.len().saturating_sub(80)..].join("\n")
        );
    }
    out
}
