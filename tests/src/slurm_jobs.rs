//! A team's Slurm batch jobs for the tests of lost nodes: the two jobs they submit, the
//! lines their steps write (`<job id> <restart count> <hostname>` to `$HOME/requeue.log`),
//! the fields of `scontrol -o show job`, what the team sees of the two jobs after the
//! node is gone, and the controllers' logs for failure messages.

use std::time::Duration;

use crate::netns::Host;
use crate::slurm_login::{shell_word, Session};
use crate::NodeAgent;

/// Submits, as `team`, two batch jobs across two nodes placed by Slurm (`sbatch -N2`, not
/// pinned: they must be able to run elsewhere), the second with `--no-requeue`; their
/// steps write where they run, then wait for `$HOME/requeue-go`. Returns their job ids
/// (the requeued one, the one run once at most).
pub fn submit_two(team: &Session) -> (String, String) {
    let step =
        "echo \"$SLURM_JOB_ID ${SLURM_RESTART_COUNT:-0} $(hostname)\" >> $HOME/requeue.log; \
                until [ -e $HOME/requeue-go ]; do sleep 0.2; done";
    let script = format!("srun -N2 --ntasks-per-node=1 sh -c {}", shell_word(step));
    let submit = |options: &str| {
        team.ok(&format!(
            "sbatch --parsable -N2 -t 10 {options} --output=requeue-%j.out --wrap {}",
            shell_word(&script)
        ))
        .trim()
        .to_string()
    };
    (submit("-J requeued"), submit("-J once --no-requeue"))
}

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

/// The requeued job `job`, as `team` sees it, running its second run of its batch script.
pub fn assert_running_again(team: &Session, job: &str) {
    let shown = team.ok(&format!("scontrol -o show job {job}"));
    assert_eq!(field(&shown, "JobState"), Some("RUNNING"), "{shown}");
    assert_eq!(field(&shown, "Restarts"), Some("1"), "{shown}");
    assert_eq!(field(&shown, "BatchFlag"), Some("1"), "{shown}");
}

/// Waits (at most `limit`, a safety net) until the requeued job `job` completes, then
/// checks it completed its second run, cleanly, on exactly `nodes` (sorted).
pub async fn assert_completes_on(team: &Session, job: &str, nodes: &[String], limit: Duration) {
    crate::eventually("the requeued job completing", limit, || {
        let state = team
            .poll(&format!("scontrol -o show job {job}"))
            .and_then(|s| field(&s, "JobState").map(str::to_string));
        async move { (state.as_deref() == Some("COMPLETED")).then_some(()) }
    })
    .await;
    let shown = team.ok(&format!("scontrol -o show job {job}"));
    assert_eq!(field(&shown, "Restarts"), Some("1"), "{shown}");
    assert_eq!(field(&shown, "ExitCode"), Some("0:0"), "{shown}");
    let ran_on = team.ok(&format!(
        "scontrol show hostnames {}",
        field(&shown, "NodeList").unwrap_or_default()
    ));
    let mut ran_on: Vec<String> = ran_on.lines().map(|l| l.trim().to_string()).collect();
    ran_on.sort();
    assert_eq!(ran_on, nodes, "{shown}");
}

/// The job submitted with `--no-requeue`, `once`: ended with its node, never run again.
pub fn assert_ended_with_the_node(team: &Session, once: &str) {
    let ended = team.ok(&format!("scontrol -o show job {once}"));
    assert_eq!(field(&ended, "JobState"), Some("NODE_FAIL"), "{ended}");
    assert_eq!(field(&ended, "Restarts"), Some("0"), "{ended}");
}
