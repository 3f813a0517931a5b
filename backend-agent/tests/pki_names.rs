//! `gpufleet-agent pki` as the node agents guide runs it on day two: adding a host and
//! renewing an agent's certificate (`pki --agent NAME`, no `--server-name`) keep the server
//! certificate's names, and renewing the server certificate without them (`pki --dir D`)
//! issues it again for the names it has. `serve` reloads `server.pem`: one rewritten for
//! localhost only would cut off every remote client.

use std::path::Path;
use std::process::Command;

use gpufleet_wire::pki::{pem_der, subject_alt_names};

fn pki(dir: &Path, args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .arg("pki")
        .arg("--dir")
        .arg(dir)
        .args(args)
        .output()
        .expect("run gpufleet-agent pki");
    assert!(
        out.status.success(),
        "pki {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn server_names(dir: &Path) -> Vec<String> {
    let pem = std::fs::read_to_string(dir.join("server.pem")).expect("server.pem");
    subject_alt_names(&pem_der(&pem).expect("a PEM certificate")).expect("its names")
}

#[test]
fn adding_and_renewing_agents_and_renewing_the_server_keep_the_server_names() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pki");
    pki(
        &dir,
        &[
            "--server-name",
            "10.99.51.5",
            "--agent",
            "gpu-a",
            "--agent",
            "gpu-b",
        ],
    );
    let want = ["10.99.51.5", "localhost", "127.0.0.1"];
    assert_eq!(server_names(&dir), want);
    let server = std::fs::read(dir.join("server.pem")).unwrap();

    // A new host, then a renewed agent certificate: the server certificate is not touched.
    pki(&dir, &["--agent", "gpu-c"]);
    pki(&dir, &["--agent", "gpu-a"]);
    assert_eq!(server_names(&dir), want);
    assert_eq!(std::fs::read(dir.join("server.pem")).unwrap(), server);
    assert!(dir.join("agent-gpu-c.pem").exists());

    // The server certificate renewed without --server-name: new, with the same names.
    pki(&dir, &[]);
    assert_ne!(std::fs::read(dir.join("server.pem")).unwrap(), server);
    assert_eq!(server_names(&dir), want);
}
