//! The serve unit's environment file is all an operator on the control plane's host needs:
//! `serve` started from it alone (no flag, as `gpufleet-serve.service` starts it), and
//! `token rotate join` and `nodes` run with the same environment and no flag (their
//! endpoint, CA and data dir come from serve's GPUFLEET_* variables), as the guides show.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

const AGENT: &str = env!("CARGO_BIN_EXE_gpufleet-agent");

/// `gpufleet-agent ARGS` with exactly `env` (and PATH) as its environment.
fn command(args: &[&str], env: &[(String, String)]) -> Command {
    let mut cmd = Command::new(AGENT);
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (k, v)));
    cmd
}

fn succeeded(args: &[&str], out: Output) -> String {
    assert!(
        out.status.success(),
        "gpufleet-agent {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The settings of docs/guides/fleet-across-hosts.md's serve.env, in `dir`.
fn serve_env(dir: &Path, port: u16) -> Vec<(String, String)> {
    let path = |f: &str| dir.join(f).display().to_string();
    [
        ("GPUFLEET_DATA_DIR", path("data")),
        ("GPUFLEET_LISTEN", format!("0.0.0.0:{port}")),
        ("GPUFLEET_NODE_AGENTS", "external".to_string()),
        ("GPUFLEET_TLS_CERT", path("pki/server.pem")),
        ("GPUFLEET_TLS_KEY", path("pki/server.key")),
        ("GPUFLEET_AGENT_CA", path("pki/ca.pem")),
        ("GPUFLEET_AGENT_CRL", path("pki/agents.crl")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn token_rotate_join_and_nodes_work_with_the_serve_units_environment_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = dir.join("pki").display().to_string();
    let args = ["pki", "--dir", &pki, "--agent", "gpu-a"];
    succeeded(&args, command(&args, &[]).output().unwrap());

    let env = serve_env(dir, free_port());
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let mut serve = Serve(
        command(&["serve"], &env)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(serve.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.starts_with("gpufleet-agent listening on "),
        "{line:?}; log:\n{}",
        std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
    );

    let join_token = dir.join("data/join.token");
    let before = std::fs::read_to_string(&join_token).unwrap();
    let args = ["token", "rotate", "join", "--overlap", "1h"];
    let printed = succeeded(&args, command(&args, &env).output().unwrap());
    let after = std::fs::read_to_string(&join_token).unwrap();
    assert_ne!(before.trim(), after.trim(), "join.token rotated");
    assert!(printed.contains(after.trim()), "{printed}");

    let args = ["nodes"];
    succeeded(&args, command(&args, &env).output().unwrap());
}
