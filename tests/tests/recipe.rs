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

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpufleet_e2e::netns::{self, Host, Network};
use gpufleet_e2e::recipe::{self, Kind, Step};
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

/// `systemctl enable --now UNIT` as systemd runs the unit: its ExecStart (the binary from
/// PATH) with its EnvironmentFile, then the test's override, detached, logging to a file.
const PRELUDE: &str = r#"
systemctl() {
  if [ "$1" != enable ] || [ "$2" != --now ] || [ $# -ne 3 ]; then
    echo "recipe: only 'systemctl enable --now UNIT' is stood in for, not: systemctl $*" >&2
    return 2
  fi
  local unit="$3" file="$GF_UNITS/$3.service" env_file exec_start
  [ -f "$file" ] || { echo "recipe: no unit $file" >&2; return 1; }
  env_file=$(sed -n 's/^EnvironmentFile=//p' "$file")
  exec_start=$(sed -n 's/^ExecStart=//p' "$file")
  exec_start=${exec_start#/usr/local/bin/}
  (
    set -a
    . "$env_file"
    if [ -f "$GF_OVERRIDES/$unit.env" ]; then . "$GF_OVERRIDES/$unit.env"; fi
    set +a
    umask 0077
    exec setsid $exec_start </dev/null >>"$GF_LOGS/$unit.log" 2>&1
  ) &
}
cd ~
"#;

/// The test's side of the hosts: their dirs for logs and overrides, and the guide's
/// environment.
struct Site {
    net: Network,
    env: Vec<(String, String)>,
    /// `<root>/logs/<host>-<unit>.log`, and the prelude file.
    root: PathBuf,
}

impl Site {
    fn host(&self, name: &str) -> &Host {
        self.net.host(name)
    }

    fn logs(&self, host: &str) -> PathBuf {
        self.root.join("logs").join(host)
    }

    /// Every log the units wrote, for a failure's message.
    fn all_logs(&self) -> String {
        let mut text = String::new();
        for host in HOSTS {
            let Ok(entries) = std::fs::read_dir(self.logs(host)) else {
                continue;
            };
            for entry in entries.flatten() {
                let log = std::fs::read_to_string(entry.path()).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                text.push_str(&format!(
                    "--- {host}: {} (last lines)\n{}\n",
                    entry.file_name().to_string_lossy(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ));
            }
        }
        text
    }

    /// Runs `script` in a root shell on `host` (bash -eu, the prelude first): (success,
    /// output).
    fn shell(&self, host: &str, script: &str) -> (bool, String) {
        let mut command = self.host(host).command("bash");
        command
            .args(["-euo", "pipefail", "-c"])
            .arg(format!(
                ". {}\n{script}",
                self.root.join("prelude.sh").display()
            ))
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("GF_LOGS", self.logs(host));
        gpufleet_e2e::commands::output_within(&mut command, script, LIMIT)
    }

    fn run(&self, step: &Step) {
        for host in &step.hosts {
            match &step.kind {
                Kind::Values => {}
                Kind::Run | Kind::Expect(_) => self.until(step, host),
                Kind::Copy => self.copy(step, host),
                Kind::Background | Kind::File(_) => panic!(
                    "guide line {}: this test runs no background or file step",
                    step.line
                ),
            }
        }
    }

    /// Runs the step; with `retry`, again until it is done.
    fn until(&self, step: &Step, host: &str) {
        let deadline = Instant::now() + LIMIT;
        loop {
            let (ok, out) = self.shell(host, &step.script);
            if recipe::done(step, ok, &out) {
                println!("--- {host}, guide line {}:\n{out}", step.line);
                return;
            }
            assert!(step.retry, "{}", self.failed(step, host, &out));
            assert!(
                Instant::now() < deadline,
                "{}",
                self.failed(step, host, &format!("still not so after {LIMIT:?}:\n{out}"))
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn copy(&self, step: &Step, from: &str) {
        for copy in recipe::copies(&step.script) {
            for source in &copy.sources {
                let read = self.host(from).run("cat", &[source]);
                assert!(
                    read.status.success(),
                    "{}",
                    self.failed(step, from, &String::from_utf8_lossy(&read.stderr))
                );
                let mode = self.host(from).run("stat", &["-c", "%a", source]);
                let mode = String::from_utf8_lossy(&mode.stdout).trim().to_string();
                let name = Path::new(source).file_name().unwrap().to_string_lossy();
                let dest = format!("{}/{name}", copy.dir.trim_end_matches('/'));
                // As scp: into a folder that is there, never one made for the reader.
                let mut write = self
                    .host(&copy.host)
                    .command("sh")
                    .args([
                        "-c",
                        r#"test -d "$1" && cat > "$2" && chmod "$3" "$2""#,
                        "sh",
                    ])
                    .args([&copy.dir, &dest, &mode])
                    .stdin(Stdio::piped())
                    .spawn()
                    .expect("write the copy");
                write.stdin.take().unwrap().write_all(&read.stdout).unwrap();
                assert!(
                    write.wait().unwrap().success(),
                    "{}",
                    self.failed(
                        step,
                        from,
                        &format!(
                            "copy {source} to {}:{dest}: no folder {}",
                            copy.host, copy.dir
                        )
                    )
                );
            }
        }
    }

    fn failed(&self, step: &Step, host: &str, out: &str) -> String {
        format!(
            "the guide's step at line {} failed on {host}:\n{}\n--- output\n{out}\n{}",
            step.line,
            step.script,
            self.all_logs()
        )
    }
}

/// Gives each host its own `/root`, `/var/lib` and `/srv` (what the recipe writes there
/// stays on the host), the platform's hosts what the guide takes as given (the shared
/// storage mounted, `/etc/gpufleet` from the release's INSTALL), and the test's files.
fn prepare(net: Network, storage: &SharedStorage) -> Site {
    let root = tempfile::Builder::new()
        .prefix("gpufleet-recipe-")
        .tempdir_in(net.host("cp").dir().parent().unwrap())
        .unwrap()
        .keep();
    std::fs::write(root.join("prelude.sh"), PRELUDE).unwrap();
    let overrides = root.join("overrides");
    std::fs::create_dir_all(&overrides).unwrap();
    for (unit, env) in OVERRIDES {
        std::fs::write(overrides.join(format!("{unit}.env")), env).unwrap();
    }
    for name in HOSTS {
        std::fs::create_dir_all(root.join("logs").join(name)).unwrap();
        net.host(name).private_copies(&[
            Path::new("/root"),
            Path::new("/var/lib"),
            Path::new("/srv"),
        ]);
    }
    for name in PLATFORM {
        storage.mount_on(net.host(name), Path::new(SHARED));
        let out = net
            .host(name)
            .run("install", &["-d", "-m", "0700", "/etc/gpufleet"]);
        assert!(out.status.success(), "{name}: /etc/gpufleet");
    }
    // The built binaries first on PATH.
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(gpufleet_e2e::binaries::agent(), bin.join("gpufleet-agent"))
        .unwrap();
    std::os::unix::fs::symlink(gpufleet_e2e::binaries::terraform(), bin.join("terraform")).unwrap();
    let provider_dir = gpufleet_e2e::binaries::provider()
        .parent()
        .unwrap()
        .to_path_buf();
    let cli_config = root.join("cli.tfrc");
    std::fs::write(
        &cli_config,
        format!(
            "provider_installation {{\n  dev_overrides {{\n    \"gpufleet/gpufleet\" = \"{}\"\n  }}\n  direct {{}}\n}}\n",
            provider_dir.display()
        ),
    )
    .unwrap();
    let env = vec![
        ("CP_ADDR".to_string(), net.host("cp").addr().to_string()),
        ("HOME".into(), "/root".into()),
        (
            "PATH".into(),
            format!(
                "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                bin.display()
            ),
        ),
        (
            "TF_CLI_CONFIG_FILE".into(),
            cli_config.display().to_string(),
        ),
        ("CHECKPOINT_DISABLE".into(), "1".into()),
        ("TF_IN_AUTOMATION".into(), "1".into()),
        (
            "GF_UNITS".into(),
            repo().join("packaging/systemd").display().to_string(),
        ),
        ("GF_OVERRIDES".into(), overrides.display().to_string()),
    ];
    Site { net, env, root }
}

#[test]
fn the_multi_host_guide_runs_as_written_and_a_team_runs_a_job_across_hosts() {
    netns::require("the recipe's hosts");
    for program in [
        "ssh",
        "ssh-keygen",
        "jq",
        "slurmctld",
        "slurmd",
        "munged",
        "sshd",
    ] {
        let found = Command::new("sh")
            .args([
                "-c",
                &format!("command -v {program} >/dev/null || test -x /usr/sbin/{program}"),
            ])
            .status()
            .unwrap()
            .success();
        assert!(
            found,
            "the recipe needs {program} (scripts/bootstrap.sh installs it)"
        );
    }
    let guide = std::fs::read_to_string(repo().join("docs/guides/fleet-across-hosts.md"))
        .expect("the guide");
    let steps = recipe::parse(&guide);
    // Mounted before the hosts are made, so that each sees it (and binds it at SHARED).
    let storage = SharedStorage::new(SHARED_GIB);
    let site = prepare(Network::new(&HOSTS), &storage);
    let given: Vec<&str> = site.env.iter().map(|(k, _)| k.as_str()).collect();
    for step in steps.iter().filter(|s| s.kind == Kind::Values) {
        for name in recipe::exported(&step.script) {
            assert!(
                given.contains(&name.as_str()),
                "the guide's value {name} is not given by the test"
            );
        }
    }
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
