//! The first guide a user follows, as they follow it: the commands of
//! `docs/guides/getting-started.md`, read from that file and run as they are, in one shell
//! session, from the repository root, on a namespace host of their own ("machine": its own
//! loopback, so `serve` has its documented port 7700 to itself), from nothing to a team's
//! cluster, its own token that sees only its node, an empty second plan and a clean destroy.
//!
//! What the test gives that a reader has or does themselves, and nothing else:
//! - the repository as checked out and built (this test's own checkout; the guide's build
//!   step is not run again: `scripts/test.sh` has built the binaries). The host sees it
//!   through an overlay, so what the guide writes there (`.gpufleet/`, `dev.tfrc`,
//!   `first/`, the token file) stays on the host; `/root` likewise;
//! - one shell: each block runs with the variables and directory the blocks before it
//!   left, as in a terminal; the block the guide runs "in another shell" (`serve`) runs
//!   detached, and gets Ctrl-C (SIGINT) at the end, as the guide says;
//! - a "yes" to each of Terraform's questions (`apply`, `destroy`).
//!
//! Not run: the build (above) and the alternative install from a release mirror (its own
//! test is `tests/tests/release.rs`).

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use gpufleet_e2e::netns::{self, Host, Network};
use gpufleet_e2e::recipe::{self, Kind, Step};

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(180);
const HOST: &str = "machine";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository root")
}

/// The reader's terminal session: its variables and directory between blocks.
struct Session<'a> {
    host: &'a Host,
    /// Where the session's state, answers and background logs are (the host's dir).
    state: PathBuf,
    /// The detached blocks (`serve`), each its own process group.
    background: Vec<(Step, Child)>,
}

impl Session<'_> {
    /// `block` as the session's next command lines: the variables and directory the last
    /// block left, Terraform's questions answered yes, and (`save`) what it leaves saved
    /// after.
    fn script(&self, block: &str, save: bool) -> String {
        let s = self.state.display();
        let mut script =
            format!(". '{s}/env'\ncd \"$(cat '{s}/cwd')\"\nexec < '{s}/answers'\n{block}\n");
        if save {
            script += &format!("export -p > '{s}/env'\npwd > '{s}/cwd'\n");
        }
        script
    }

    fn shell(&self, block: &str) -> (bool, String) {
        let mut command = self.host.command("bash");
        command
            .args(["-e", "-o", "pipefail", "-c"])
            .arg(self.script(block, true))
            .env_clear()
            .envs(start_env());
        gpufleet_e2e::commands::output_within(&mut command, block, LIMIT)
    }

    fn run(&mut self, step: &Step) {
        match &step.kind {
            Kind::Run | Kind::Expect(_) => self.until(step),
            Kind::Background => self.detach(step),
            Kind::File(path) => {
                let script = format!(
                    "mkdir -p \"$(dirname '{path}')\"\ncat > '{path}' <<'GUIDE_FILE_END'\n{}GUIDE_FILE_END",
                    step.script
                );
                let (ok, out) = self.shell(&script);
                assert!(ok, "{}", self.failed(step, &out));
            }
            Kind::Values | Kind::Copy => {
                panic!(
                    "guide line {}: this guide has no values or copies",
                    step.line
                )
            }
        }
    }

    /// Runs the step; with `retry`, again until it is done.
    fn until(&self, step: &Step) {
        let deadline = Instant::now() + LIMIT;
        loop {
            let (ok, out) = self.shell(&step.script);
            if recipe::done(step, ok, &out) {
                println!("--- guide line {}:\n{out}", step.line);
                return;
            }
            assert!(step.retry, "{}", self.failed(step, &out));
            assert!(
                Instant::now() < deadline,
                "{}",
                self.failed(step, &format!("still not so after {LIMIT:?}:\n{out}"))
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The block in a shell of its own (its own process group, as a terminal's job),
    /// output to a log.
    fn detach(&mut self, step: &Step) {
        let log = std::fs::File::create(self.log(step)).unwrap();
        let mut command = self.host.launcher().daemon("bash");
        command
            .args(["-e", "-o", "pipefail", "-c"])
            .arg(self.script(&step.script, false))
            .env_clear()
            .envs(start_env())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = self
            .host
            .launcher()
            .spawn(&mut command)
            .unwrap_or_else(|e| panic!("guide line {}: {e}", step.line));
        self.background.push((step.clone(), child));
    }

    fn log(&self, step: &Step) -> PathBuf {
        self.state.join(format!("background-{}.log", step.line))
    }

    /// Ctrl-C to each detached block, and its end.
    fn interrupt_all(&mut self) {
        for (step, mut child) in std::mem::take(&mut self.background) {
            // SAFETY: a signal to the process group the block leads.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGINT) };
            let deadline = Instant::now() + LIMIT;
            let status = loop {
                if let Some(status) = child.try_wait().unwrap() {
                    break status;
                }
                assert!(
                    Instant::now() < deadline,
                    "guide line {}: still running {LIMIT:?} after Ctrl-C",
                    step.line
                );
                std::thread::sleep(Duration::from_millis(50));
            };
            let log = std::fs::read_to_string(self.log(&step)).unwrap_or_default();
            assert!(
                status.success(),
                "guide line {}: ended {status} after Ctrl-C:\n{log}",
                step.line
            );
        }
    }

    fn failed(&self, step: &Step, out: &str) -> String {
        let logs: String = self
            .background
            .iter()
            .map(|(s, _)| {
                let log = std::fs::read_to_string(self.log(s)).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                format!(
                    "--- the block at guide line {} (last lines)\n{}\n",
                    s.line,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect();
        format!(
            "the guide's step at line {} failed:\n{}\n--- output\n{out}\n{logs}",
            step.line, step.script
        )
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        for (_, child) in &mut self.background {
            // SAFETY: as in interrupt_all; the test failed, the network's teardown follows.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
        }
    }
}

/// What a login shell of this machine starts with (its PATH, which has cargo's).
fn start_env() -> Vec<(String, String)> {
    vec![
        ("HOME".into(), "/root".into()),
        ("USER".into(), "root".into()),
        ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
    ]
}

#[test]
fn the_getting_started_guide_runs_as_written() {
    netns::require("the getting-started guide's host");
    let guide =
        std::fs::read_to_string(repo().join("docs/guides/getting-started.md")).expect("the guide");
    let steps = recipe::parse(&guide);
    assert!(
        steps.iter().all(|s| s.hosts == [HOST]),
        "every step of the guide runs on {HOST}"
    );
    let net = Network::new(&[HOST]);
    let host = net.host(HOST);
    let repo = repo();
    host.private_copies(&[Path::new("/root"), &repo]);
    // A fresh start on the host, whatever an earlier run of the guide by hand left in this
    // checkout (the machine's copy keeps it).
    let mut rm = vec!["-rf".to_string(), "--".into()];
    rm.extend(
        [".gpufleet", "first", "dev.tfrc", "ml-research.token"]
            .map(|f| repo.join(f).display().to_string()),
    );
    let fresh = host.run("rm", &rm.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(fresh.status.success(), "{fresh:?}");
    let state = host.dir().join("session");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("env"), "").unwrap();
    std::fs::write(state.join("cwd"), repo.display().to_string()).unwrap();
    std::fs::write(state.join("answers"), "yes\n".repeat(20)).unwrap();
    let mut session = Session {
        host,
        state,
        background: Vec::new(),
    };
    let (commands, flags) = recipe::size(&steps);
    println!(
        "the guide: {} steps, {commands} commands, {flags} flags",
        steps.len()
    );
    let (destroy, before) = steps.split_last().unwrap();
    assert!(
        destroy.script.contains("destroy"),
        "the guide ends with the clean-up"
    );
    for step in before {
        session.run(step);
    }
    // The team's token file is the reader's alone; the state holds no credential.
    let (ok, mode) = session.shell("stat -c %a ml-research.token");
    assert!(ok && mode.trim() == "600", "the token file's mode: {mode}");
    let (ok, state) = session.shell("cat first/terraform.tfstate");
    assert!(ok && state.contains("ml-research"), "{state}");
    for secret in ["gft_", "gfa_"] {
        assert!(!state.contains(secret), "the state holds {secret:?}");
    }
    session.run(destroy);
    // The guide's last word: Ctrl-C stops serve, cleanly.
    session.interrupt_all();
    // Nothing of the guide reached the machine's checkout.
    assert!(
        !repo.join(".gpufleet").exists() && !repo.join("first").exists(),
        "the guide's files are on the host only"
    );
}
