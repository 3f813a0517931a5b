//! Running a command a test waits on, with a limit as its safety net.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `command` (no stdin) and returns (success, stdout + stderr); panics naming `what`
/// when it runs past `limit` (a hang, never a timing assertion).
pub fn output_within(command: &mut Command, what: &str, limit: Duration) -> (bool, String) {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {what}: {e}"));
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("{what}: still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}
