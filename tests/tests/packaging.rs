//! The service units and their example environment files (`packaging/`) as an operator
//! installs them: every setting they give is one the binary takes for that subcommand (so
//! a renamed flag cannot leave a unit that silently ignores it), no token is on a command
//! line, and the stop and file limits are what docs/operations.md says (the agents' Slurm
//! daemons outlive a stop: `KillMode=process`).

use std::collections::BTreeSet;
use std::path::PathBuf;

fn packaging() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging")
}

/// The `GPUFLEET_*` variables `gpufleet-agent SUBCOMMAND --help` names.
fn variables_of(subcommand: &str) -> BTreeSet<String> {
    let out = std::process::Command::new(gpufleet_e2e::binaries::agent())
        .args([subcommand, "--help"])
        .output()
        .expect("run gpufleet-agent --help");
    String::from_utf8_lossy(&out.stdout)
        .split("env: ")
        .skip(1)
        .filter_map(|rest| rest.split(['=', ']']).next())
        .map(str::to_string)
        .collect()
}

/// `KEY` of each `KEY=VALUE` line (comments and blank lines aside).
fn keys(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim().to_string()))
        .collect()
}

/// The value of the unit's `KEY=` line.
fn unit_value(unit: &str, key: &str) -> String {
    let prefix = format!("{key}=");
    unit.lines()
        .find_map(|l| l.trim().strip_prefix(&prefix))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no {key}= in the unit"))
}

#[test]
fn the_service_units_and_their_environment_files_match_the_binary() {
    for (subcommand, unit, env) in [
        (
            "serve",
            "systemd/gpufleet-serve.service",
            "serve.env.example",
        ),
        ("node", "systemd/gpufleet-node.service", "node.env.example"),
    ] {
        let unit = std::fs::read_to_string(packaging().join(unit)).unwrap();
        let env = std::fs::read_to_string(packaging().join(env)).unwrap();
        let known = variables_of(subcommand);
        assert!(!known.is_empty(), "no variables in `{subcommand} --help`");
        for key in keys(&env) {
            assert!(
                known.contains(&key),
                "{key} of the {subcommand} environment file is not a variable `gpufleet-agent {subcommand}` reads"
            );
        }
        let exec = unit_value(&unit, "ExecStart");
        assert_eq!(exec, format!("/usr/local/bin/gpufleet-agent {subcommand}"));
        assert!(
            !exec.contains("token"),
            "a token on the command line: {exec}"
        );
        assert_eq!(unit_value(&unit, "KillSignal"), "SIGTERM");
        // The Slurm daemons and jobs an agent leaves running outlive its stop.
        assert_eq!(unit_value(&unit, "KillMode"), "process");
        let nofile: u64 = unit_value(&unit, "LimitNOFILE").parse().unwrap();
        assert!(nofile >= 65_536);
        // The stop waits out the connections' grace (3s) and the agents' (30s).
        let stop: u64 = unit_value(&unit, "TimeoutStopSec").parse().unwrap();
        assert!(stop > 33, "{stop}");
        assert_eq!(
            unit_value(&unit, "EnvironmentFile"),
            format!("/etc/gpufleet/{subcommand}.env")
        );
    }
}
