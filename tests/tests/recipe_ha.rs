//! The high-availability guide as an operator follows it (issue 41): the commands of
//! `docs/guides/high-availability.md`, read from that file and run as they are on eight
//! namespace hosts (`db-1`..`db-3`, `cp-1`..`cp-3`, `gpu-a`, `gpu-b`, `workstation`), from
//! nothing to a three-member Patroni cluster, three `serve` replicas on it over TLS, node
//! agents that know them all, a pipeline's apply of a team's Slurm cluster through their
//! `endpoints` with an empty plan after, the team's `srun -N2 hostname` across both GPU
//! hosts through its own login, and a clean `check`.
//!
//! What the test gives that a reader has or gives themselves, and nothing else:
//! - the guide's values (`DB1`..`DB3`, `CP1`..`CP3`: the hosts' addresses);
//! - each host's own `/root`, `/var/lib` and `/srv` (overlays, so nothing reaches this
//!   machine's), and `/etc/gpufleet` (0700) on the `cp` hosts and the GPU hosts (the
//!   release's `INSTALL`); `gpufleet-agent` and `terraform` on PATH (the built binaries;
//!   the provider through a development override);
//! - `systemctl enable --now UNIT` and `scp -p` stood in for (`recipe_site`), with one
//!   setting changed: the node agents' GPUs are simulated (`GPUFLEET_HARDWARE=sim`).
//!
//! It prints how many commands and flags the recipe takes.

use std::path::PathBuf;
use std::time::Duration;

use gpufleet_e2e::netns::{self, Network};
use gpufleet_e2e::recipe::{self, Kind};
use gpufleet_e2e::recipe_site::{require_programs, Site, Spec};

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(180);
const HOSTS: [&str; 9] = [
    "db-1",
    "db-2",
    "db-3",
    "cp-1",
    "cp-2",
    "cp-3",
    "gpu-a",
    "gpu-b",
    "workstation",
];
const INSTALLED: [&str; 5] = ["cp-1", "cp-2", "cp-3", "gpu-a", "gpu-b"];
/// The guide's values, each the address of a host.
const VALUES: [(&str, &str); 6] = [
    ("DB1", "db-1"),
    ("DB2", "db-2"),
    ("DB3", "db-3"),
    ("CP1", "cp-1"),
    ("CP2", "cp-2"),
    ("CP3", "cp-3"),
];
/// No GPU here: simulated ones; everything else as the guide writes it.
const OVERRIDES: [(&str, &str); 1] = [("gpufleet-node", "GPUFLEET_HARDWARE=sim\n")];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn the_high_availability_guide_runs_as_written() {
    netns::require("the high-availability recipe's hosts");
    require_programs(&[
        "patroni",
        "patronictl",
        "psql",
        "setpriv",
        "hostname",
        "ssh",
        "ssh-keygen",
        "jq",
        "slurmctld",
        "slurmd",
        "munged",
        "sshd",
    ]);
    let guide = std::fs::read_to_string(repo().join("docs/guides/high-availability.md"))
        .expect("the guide");
    let steps = recipe::parse(&guide);
    let net = Network::new(&HOSTS);
    let values = VALUES
        .iter()
        .map(|(name, host)| (name.to_string(), net.host(host).addr().to_string()))
        .collect();
    let site = Site::prepare(
        net,
        Spec {
            hosts: &HOSTS,
            installed: &INSTALLED,
            values,
            overrides: &OVERRIDES,
            limit: LIMIT,
        },
    );
    site.gives_every_value(&steps);
    let (commands, flags) = recipe::size(&steps);
    println!(
        "the recipe: {} steps, {commands} commands, {flags} flags",
        steps.len()
    );

    for step in &steps {
        site.run(step);
    }
    // The guide ends with the store checked: nothing promised is missing.
    assert!(
        matches!(&steps.last().unwrap().kind, Kind::Expect(g) if g == &[vec!["no".to_string(), "violation".to_string()]]),
        "the guide ends with a clean check"
    );

    // One replica leads (whichever took the lease first: they start together); the
    // others found its lease and pass calls on.
    let replicas = ["cp-1", "cp-2", "cp-3"];
    let leaders: Vec<&str> = replicas
        .into_iter()
        .filter(|host| {
            site.unit_log(host, "gpufleet-serve")
                .contains("this replica leads")
        })
        .collect();
    assert_eq!(leaders.len(), 1, "{leaders:?}\n{}", site.all_logs());
    for follower in replicas.into_iter().filter(|h| *h != leaders[0]) {
        let log = site.unit_log(follower, "gpufleet-serve");
        assert!(log.contains("another replica leads"), "{follower}:\n{log}");
    }
    // The database is Patroni's: a leader and a synchronous standby.
    let (ok, members) = site.shell("db-2", "patronictl -c /etc/patroni/config.yml list");
    assert!(
        ok && members.contains("Leader") && members.contains("Sync Standby"),
        "{members}"
    );
}
