//! The multi-host guide as an operator follows it (issue 33): the commands of
//! `docs/guides/fleet-across-hosts.md`, read from that file and run as they are on four
//! namespace hosts (`cp`, `gpu-a`, `gpu-b`, `workstation`), from nothing to a team running
//! `srun -N2 hostname` across the GPU hosts through its own login, over mutual TLS, with
//! its home and its controllers' state on the platform's shared storage.
//!
//! What the test gives that a reader has or gives themselves, and nothing else:
//! - the guide's values (`CP_ADDR`: the `cp` host's address);
//! - each host's own `/root`, `/var/lib` and `/srv` (overlays, so nothing reaches this
//!   machine's);
//! - the installation the guide takes as given (the release's `INSTALL`):
//!   `gpufleet-agent` and `terraform` on PATH (the built binaries; the provider through a
//!   development override, as the other e2e tests install it), the units of
//!   `packaging/systemd`, and `/etc/gpufleet` (0700) on `cp` and the GPU hosts;
//! - the platform's shared storage: a loop-mounted btrfs image (`shared_storage`) mounted
//!   at `/srv/gpufleet-shared` on `cp` and the GPU hosts;
//! - `systemctl enable --now UNIT`: the unit file run as systemd would (its `ExecStart`
//!   with its `EnvironmentFile`), in the host's namespaces, with one setting changed: the
//!   node agents' GPUs are simulated (`GPUFLEET_HARDWARE=sim`, no GPU here), the
//!   catalog's 8 H100-80GB per host, beside the host's real CPUs and memory;
//! - `scp -p`: the files copied between the hosts with their modes, into a folder that
//!   must be there already, as scp's.
//!
//! It prints how many commands and flags the recipe takes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpufleet_e2e::netns::{self, Network};
use gpufleet_e2e::recipe::{self, Kind};
use gpufleet_e2e::recipe_site::{require_programs, Site, Spec};
use gpufleet_e2e::shared_storage::SharedStorage;

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(180);
const HOSTS: [&str; 4] = ["cp", "gpu-a", "gpu-b", "workstation"];
/// The hosts of the platform: gpufleet installed, the shared storage mounted.
const PLATFORM: [&str; 3] = ["cp", "gpu-a", "gpu-b"];
/// Where the guide says the platform mounts its shared storage.
const SHARED: &str = "/srv/gpufleet-shared";
/// The shared storage's size: room for the guide's team volume (`storage_gib = 100`); a
/// sparse image takes only what is written.
const SHARED_GIB: u64 = 128;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What each unit runs with here beside its environment file (a systemd drop-in): no GPU
/// here, so simulated ones; everything else as the guide writes it.
const OVERRIDES: [(&str, &str); 1] = [("gpufleet-node", "GPUFLEET_HARDWARE=sim\n")];

#[test]
fn the_multi_host_guide_runs_as_written_and_a_team_runs_a_job_across_hosts() {
    netns::require("the recipe's hosts");
    require_programs(&[
        "ssh",
        "ssh-keygen",
        "jq",
        "slurmctld",
        "slurmd",
        "munged",
        "sshd",
    ]);
    let guide = std::fs::read_to_string(repo().join("docs/guides/fleet-across-hosts.md"))
        .expect("the guide");
    let steps = recipe::parse(&guide);
    // Mounted before the hosts are made, so that each sees it (and binds it at SHARED).
    let storage = SharedStorage::new(SHARED_GIB);
    let net = Network::new(&HOSTS);
    let values = vec![("CP_ADDR".to_string(), net.host("cp").addr().to_string())];
    let site = Site::prepare(
        net,
        Spec {
            hosts: &HOSTS,
            installed: &PLATFORM,
            values,
            overrides: &OVERRIDES,
            limit: LIMIT,
        },
    );
    for name in PLATFORM {
        storage.mount_on(site.host(name), Path::new(SHARED));
    }
    site.gives_every_value(&steps);
    let (commands, flags) = recipe::size(&steps);
    println!(
        "the recipe: {} steps, {commands} commands, {flags} flags",
        steps.len()
    );

    for step in &steps {
        site.run(step);
    }
    // The last step is the team's job: its output came from both GPU hosts (checked by
    // its expect), through the login the credentials name.
    let last = steps.last().unwrap();
    assert!(
        matches!(&last.kind, Kind::Expect(g) if g.iter().map(|w| w[0].as_str()).eq(["gpu-a", "gpu-b"])),
        "the guide ends with the team's job answering from both hosts"
    );

    // The team's home is its volume on the shared storage (what the login wrote is
    // there), and the controllers' state is beside the volumes.
    let volume = storage
        .subvolumes()
        .into_iter()
        .find(|v| v.ends_with("/train"))
        .unwrap_or_else(|| {
            panic!(
                "no team volume on the shared storage: {:?}",
                storage.subvolumes()
            )
        });
    assert!(
        storage.path().join(&volume).join("note").is_file(),
        "the team's note is not in its volume {volume}"
    );
    let states: Vec<String> = std::fs::read_dir(storage.path().join(".slurm"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        states.iter().any(|s| s.contains("@gpu-")),
        "no controller state on the shared storage: {states:?}"
    );

    // The login listens in the platform's fixed Slurm range (docs/guides/slurm.md, "Ports").
    let (ok, port) = site.shell("workstation", "jq -r .port /root/fleet/login.json");
    let port: u16 = port
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{ok} {port}"));
    assert!((20000..=29999).contains(&port), "login port {port}");

    // The state holds no credential: no token, no login details, no key.
    let (ok, state) = site.shell("workstation", "cat /root/fleet/terraform.tfstate");
    assert!(ok, "{state}");
    for secret in ["gft_", "gfa_", "known_hosts", "PRIVATE KEY"] {
        assert!(!state.contains(secret), "the state holds {secret:?}");
    }

    // Not the guide's: the team's cluster destroyed, so its Slurm goes before the hosts.
    let (ok, out) = site.shell(
        "workstation",
        "cd /root/fleet && export GPUFLEET_TOKEN=\"$(cat admin.token)\" && terraform destroy -auto-approve -var \"cp_addr=$CP_ADDR\"",
    );
    assert!(ok, "destroy: {out}\n{}", site.all_logs());
}
