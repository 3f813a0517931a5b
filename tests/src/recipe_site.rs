//! The namespace hosts a guide's recipe runs on (`recipe`'s steps), as a reader's
//! machines would be: each host's own `/root`, `/var/lib` and `/srv`, the release's
//! installation (`gpufleet-agent` and `terraform` on PATH, the provider through a
//! development override), a root shell per step, and stand-ins for `systemctl enable
//! --now` and `scp -p`. The guides' tests (`tests/tests/recipe.rs`,
//! `tests/tests/recipe_ha.rs`) say what else they give.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::netns::{Host, Network};
use crate::recipe::{self, Kind, Step};

/// `systemctl enable --now UNIT` as systemd runs the unit: its ExecStart (the binary from
/// PATH) with its EnvironmentFile (optional with a leading `-`) and as its `User=`, then
/// the test's override, detached, logging to a file. Units are the release's
/// (`packaging/systemd`) or the distribution's (`/lib/systemd/system`: Debian's patroni).
const PRELUDE: &str = r#"
systemctl() {
  if [ "$1" != enable ] || [ "$2" != --now ] || [ $# -ne 3 ]; then
    echo "recipe: only 'systemctl enable --now UNIT' is stood in for, not: systemctl $*" >&2
    return 2
  fi
  local unit="$3" file env_file exec_start user
  file="$GF_UNITS/$3.service"
  [ -f "$file" ] || file="/lib/systemd/system/$3.service"
  [ -f "$file" ] || { echo "recipe: no unit $3" >&2; return 1; }
  env_file=$(sed -n 's/^EnvironmentFile=//p' "$file")
  exec_start=$(sed -n 's/^ExecStart=//p' "$file")
  exec_start=${exec_start#/usr/local/bin/}
  user=$(sed -n 's/^User=//p' "$file")
  (
    set -a
    case "$env_file" in
      -*) if [ -f "${env_file#-}" ]; then . "${env_file#-}"; fi ;;
      ?*) . "$env_file" ;;
    esac
    if [ -f "$GF_OVERRIDES/$unit.env" ]; then . "$GF_OVERRIDES/$unit.env"; fi
    set +a
    umask 0077
    cd /
    if [ -n "$user" ]; then
      exec setsid setpriv --reuid="$user" --regid="$user" --init-groups $exec_start </dev/null >>"$GF_LOGS/$unit.log" 2>&1
    fi
    exec setsid $exec_start </dev/null >>"$GF_LOGS/$unit.log" 2>&1
  ) &
}
cd ~
"#;

/// Fails naming the first of `programs` this machine lacks (on PATH or in /usr/sbin):
/// what a guide's hosts run is this machine's.
pub fn require_programs(programs: &[&str]) {
    for program in programs {
        let found = std::process::Command::new("sh")
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
}

/// What a guide's test gives its hosts.
pub struct Spec<'a> {
    pub hosts: &'a [&'a str],
    /// The hosts with gpufleet installed: `/etc/gpufleet` (0700), from the release's
    /// INSTALL.
    pub installed: &'a [&'a str],
    /// The guide's values (`export NAME=...`), as the test gives them.
    pub values: Vec<(String, String)>,
    /// Per unit, what runs it here beside its environment file (a systemd drop-in).
    pub overrides: &'a [(&'a str, &'a str)],
    /// How long a step (with `retry`, all its tries) may take: a safety net against
    /// hangs, never a timing assertion.
    pub limit: Duration,
}

/// The test's side of the hosts: their dirs for logs and overrides, and the guide's
/// environment.
pub struct Site {
    pub net: Network,
    pub env: Vec<(String, String)>,
    /// `<root>/logs/<host>/<unit>.log`, and the prelude file.
    root: PathBuf,
    hosts: Vec<String>,
    limit: Duration,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

impl Site {
    /// Prepares `net`'s hosts as `spec` says.
    pub fn prepare(net: Network, spec: Spec<'_>) -> Site {
        let root = tempfile::Builder::new()
            .prefix("gpufleet-recipe-")
            .tempdir_in(net.host(spec.hosts[0]).dir().parent().unwrap())
            .unwrap()
            .keep();
        std::fs::write(root.join("prelude.sh"), PRELUDE).unwrap();
        let overrides = root.join("overrides");
        std::fs::create_dir_all(&overrides).unwrap();
        for (unit, env) in spec.overrides {
            std::fs::write(overrides.join(format!("{unit}.env")), env).unwrap();
        }
        for name in spec.hosts {
            // The shell opens a unit's log as root, before the unit drops to its user.
            std::fs::create_dir_all(root.join("logs").join(name)).unwrap();
            net.host(name).private_copies(&[
                Path::new("/root"),
                Path::new("/var/lib"),
                Path::new("/srv"),
            ]);
        }
        for name in spec.installed {
            let out = net
                .host(name)
                .run("install", &["-d", "-m", "0700", "/etc/gpufleet"]);
            assert!(out.status.success(), "{name}: /etc/gpufleet");
        }
        // The built binaries first on PATH.
        let bin = root.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(crate::binaries::agent(), bin.join("gpufleet-agent")).unwrap();
        std::os::unix::fs::symlink(crate::binaries::terraform(), bin.join("terraform")).unwrap();
        let provider_dir = crate::binaries::provider().parent().unwrap().to_path_buf();
        let cli_config = root.join("cli.tfrc");
        std::fs::write(
            &cli_config,
            format!(
                "provider_installation {{\n  dev_overrides {{\n    \"gpufleet/gpufleet\" = \"{}\"\n  }}\n  direct {{}}\n}}\n",
                provider_dir.display()
            ),
        )
        .unwrap();
        let mut env = spec.values;
        env.extend([
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
        ]);
        Site {
            net,
            env,
            root,
            hosts: spec.hosts.iter().map(|h| h.to_string()).collect(),
            limit: spec.limit,
        }
    }

    pub fn host(&self, name: &str) -> &Host {
        self.net.host(name)
    }

    fn logs(&self, host: &str) -> PathBuf {
        self.root.join("logs").join(host)
    }

    /// Every log the units wrote, for a failure's message.
    pub fn all_logs(&self) -> String {
        let mut text = String::new();
        for host in &self.hosts {
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

    /// A unit's log on `host` so far.
    pub fn unit_log(&self, host: &str, unit: &str) -> String {
        std::fs::read_to_string(self.logs(host).join(format!("{unit}.log"))).unwrap_or_default()
    }

    /// Checks that every value the guide exports is one the test gives.
    pub fn gives_every_value(&self, steps: &[Step]) {
        let given: Vec<&str> = self.env.iter().map(|(k, _)| k.as_str()).collect();
        for step in steps.iter().filter(|s| s.kind == Kind::Values) {
            for name in recipe::exported(&step.script) {
                assert!(
                    given.contains(&name.as_str()),
                    "the guide's value {name} is not given by the test"
                );
            }
        }
    }

    /// Runs `script` in a root shell on `host` (bash -eu, the prelude first): (success,
    /// output).
    pub fn shell(&self, host: &str, script: &str) -> (bool, String) {
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
        crate::commands::output_within(&mut command, script, self.limit)
    }

    /// Runs one step of the guide on each of its hosts.
    pub fn run(&self, step: &Step) {
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
        let deadline = Instant::now() + self.limit;
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
                self.failed(
                    step,
                    host,
                    &format!("still not so after {:?}:\n{out}", self.limit)
                )
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
