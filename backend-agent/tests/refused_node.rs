//! A node agent the control plane refuses (here: a wrong join token) exits with the code
//! the node unit's `RestartPreventExitStatus=` names, so that systemd does not restart it
//! into the same refusal forever; docs/guides/node-agents.md documents the code.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// `gpufleet_agent::exit::REFUSED`, as packaging/systemd/gpufleet-node.service names it.
const REFUSED: i32 = 78;

#[test]
fn an_agent_with_a_wrong_join_token_exits_78_as_the_unit_expects() {
    assert_eq!(i32::from(gpufleet_agent::exit::REFUSED), REFUSED);
    let unit = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../packaging/systemd/gpufleet-node.service"),
    )
    .unwrap();
    assert!(
        unit.lines()
            .any(|l| l.trim() == format!("RestartPreventExitStatus={REFUSED}")),
        "the node unit does not keep a refused agent from restarting"
    );

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("cp");
    let serve = Agent::start_with(
        &data,
        &[
            "--admin-token",
            ADMIN,
            "--node-agents",
            "external",
            "--join-token",
            "the-right-join-token",
        ],
    );
    let mut node = Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .args([
            "node",
            "--control-plane",
            &serve.endpoint,
            "--name",
            "gpu-x",
        ])
        .args(["--gpus", "1", "--data-dir"])
        .arg(dir.path().join("node"))
        .env("GPUFLEET_JOIN_TOKEN", "a-wrong-join-token")
        .env_remove("GPUFLEET_JOIN_TOKEN_FILE")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("node.log")).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = node.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = node.kill();
            panic!("the refused agent did not exit");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = std::fs::read_to_string(dir.path().join("node.log")).unwrap();
    assert_eq!(status.code(), Some(REFUSED), "{stderr}");
    assert!(
        stderr.contains("the control plane refused node gpu-x"),
        "{stderr}"
    );
}
