//! nccl-tests' `all_reduce_perf` where the host has it: found on PATH, run with a time
//! limit, its summary read. The `long` level's load tests (`load.rs`) judge it: the
//! average bus bandwidth against the model's all-reduce figure, any out-of-bounds value
//! (a wrong result) a failure, and "not run" without the tool (never "pass").

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NAME: &str = "all_reduce_perf";
/// How long it may run (8 sizes from 64 MiB to 8 GiB take seconds on NVLink).
const LIMIT: Duration = Duration::from_secs(300);
const MAX_OUTPUT: u64 = 1 << 20;

/// `all_reduce_perf` on PATH, if any.
pub fn find() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(NAME))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// What an `all_reduce_perf` run printed that is judged.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// "# Avg bus bandwidth    : 123.45", GB/s.
    pub avg_bus_gbps: f64,
    /// "# Out of bounds values : 0 OK".
    pub out_of_bounds: u64,
}

/// The summary lines of its output.
pub fn parse(output: &str) -> Result<Summary, String> {
    let value = |key: &str| -> Option<&str> {
        output
            .lines()
            .find(|l| l.trim_start_matches('#').trim_start().starts_with(key))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim())
    };
    let avg = value("Avg bus bandwidth")
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or_else(|| "no '# Avg bus bandwidth' line in its output".to_string())?;
    let oob = value("Out of bounds values")
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    Ok(Summary {
        avg_bus_gbps: avg,
        out_of_bounds: oob,
    })
}

/// What running it gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Run {
    /// Not on this host's PATH.
    NotInstalled,
    /// It ran and printed a summary.
    Ran(Summary),
    /// It failed, timed out, or printed no summary.
    Failed(String),
}

/// Runs it across `gpus` GPUs of this host (blocking, at most five minutes).
pub fn run(gpus: u32) -> Run {
    let Some(tool) = find() else {
        return Run::NotInstalled;
    };
    match run_command(&tool, gpus).and_then(|out| parse(&out)) {
        Ok(s) => Run::Ran(s),
        Err(why) => Run::Failed(format!("all_reduce_perf -g {gpus}: {why}")),
    }
}

fn run_command(tool: &Path, gpus: u32) -> Result<String, String> {
    let mut child = Command::new(tool)
        .args([
            "-b",
            "64M",
            "-e",
            "8G",
            "-f",
            "2",
            "-g",
            &gpus.to_string(),
            "-c",
            "1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", tool.display()))?;
    let stdout = child.stdout.take().ok_or("no output pipe")?;
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.take(MAX_OUTPUT).read_to_string(&mut text);
        text
    });
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(status)) => return Err(format!("exited with {status}")),
            Ok(None) if started.elapsed() > LIMIT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("stopped after {}s", LIMIT.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => return Err(format!("waiting for it: {e}")),
        }
    }
    reader
        .join()
        .map_err(|_| "reading its output failed".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub const OUTPUT: &str = "# nThread 1 nGpus 8 minBytes 67108864 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
    67108864      16777216     float     sum      -1    420.1  159.74  279.55      0    418.9  160.20  280.35      0
  8589934592    2147483648     float     sum      -1  38110.2  225.40  394.45      0  38095.0  225.49  394.60      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 352.117
#
";

    #[test]
    fn its_summary_lines_are_read() {
        assert_eq!(
            parse(OUTPUT).unwrap(),
            Summary {
                avg_bus_gbps: 352.117,
                out_of_bounds: 0
            }
        );
        let wrong = OUTPUT.replace("values : 0 OK", "values : 3 FAILED");
        assert_eq!(parse(&wrong).unwrap().out_of_bounds, 3);
        assert!(parse("nothing").unwrap_err().contains("Avg bus bandwidth"));
    }
}
