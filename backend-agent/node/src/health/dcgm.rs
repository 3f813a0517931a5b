//! External diagnostics: `dcgmi diag -r N --json` where the host has DCGM, each of its
//! tests folded in as one `dcgm_diag:<test>` result. Without dcgmi the result says
//! "not run", never "pass".
//!
//! dcgmi's JSON comes in two shapes: DCGM 3.x puts tests under
//! `"DCGM GPU Diagnostic" > "test_categories" > [{category, tests}]` with results carrying
//! `gpu_ids`/`gpu_id` and statuses like "Pass"; DCGM 4.x uses `"DCGM Diagnostic"` (or a
//! top-level `tests` list) with results carrying `entity_id` and statuses in any case,
//! warnings as strings or `{ "warning": ... }` objects. dcgmi may print a banner before
//! the document. Anything not understood is "not run" with what was seen.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpufleet_proto::v1::CheckResult;
use serde_json::Value;

use super::checks::{result, FAIL, NOT_RUN, PASS, WARN};
use super::Level;

/// The most of dcgmi's output that is read (its JSON for 8 GPUs is tens of KiB).
const MAX_OUTPUT: u64 = 8 << 20;

/// How long each level may run before it is stopped (DCGM: seconds, ~2 min, ~15 min).
pub fn time_limit(level: Level) -> Duration {
    match level {
        Level::Quick => Duration::from_secs(300),
        Level::Medium => Duration::from_secs(900),
        Level::Long => Duration::from_secs(3600),
    }
}

/// `dcgmi` on PATH, if any.
pub fn find_dcgmi() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("dcgmi"))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Runs the diagnostic of `level` and folds its tests in; blocking.
pub fn run(level: Level) -> Vec<CheckResult> {
    let Some(dcgmi) = find_dcgmi() else {
        return vec![not_run(
            "dcgmi not installed (DCGM's diagnostics are not on this host's PATH)",
        )];
    };
    let n = level.dcgm_level();
    match run_command(&dcgmi, n, time_limit(level)) {
        Ok(out) => {
            parse(&out).unwrap_or_else(|why| vec![not_run(&format!("dcgmi diag -r {n}: {why}"))])
        }
        Err(why) => vec![not_run(&format!("dcgmi diag -r {n}: {why}"))],
    }
}

fn not_run(why: &str) -> CheckResult {
    result(
        "dcgm_diag",
        "",
        NOT_RUN,
        "not run",
        "every DCGM test passes",
        why.to_string(),
    )
}

/// Runs dcgmi with a time limit and a bounded read of its output.
fn run_command(dcgmi: &Path, level: u32, limit: Duration) -> Result<String, String> {
    let mut child = Command::new(dcgmi)
        .args(["diag", "-r", &level.to_string(), "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", dcgmi.display()))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.take(MAX_OUTPUT).read_to_string(&mut text);
        text
    });
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "stopped after {}s without an answer",
                    limit.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => return Err(format!("waiting for dcgmi: {e}")),
        }
    }
    // dcgmi exits non-zero when a test fails: the document says which.
    reader
        .join()
        .map_err(|_| "reading dcgmi's output failed".to_string())
}

/// The tests of a dcgmi JSON document (with or without a banner before it), one result
/// per test with its worst status over the GPUs.
pub fn parse(output: &str) -> Result<Vec<CheckResult>, String> {
    let (start, end) = (output.find('{'), output.rfind('}'));
    let (Some(start), Some(end)) = (start, end) else {
        return Err(format!(
            "no JSON document in its output: {}",
            excerpt(output)
        ));
    };
    if end < start {
        return Err(format!(
            "no JSON document in its output: {}",
            excerpt(output)
        ));
    }
    let doc: Value = serde_json::from_str(&output[start..=end])
        .map_err(|e| format!("its output is not JSON ({e}): {}", excerpt(output)))?;
    let tests = tests_of(&doc);
    if tests.is_empty() {
        return Err("its document lists no test".into());
    }
    Ok(tests.iter().map(|t| fold(t)).collect())
}

fn excerpt(s: &str) -> String {
    let s = s.trim();
    let cut: String = s.chars().take(200).collect();
    if cut.is_empty() {
        "(nothing)".into()
    } else {
        cut
    }
}

/// Every test object, whichever shape the document has.
fn tests_of(doc: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for key in ["DCGM GPU Diagnostic", "DCGM Diagnostic"] {
        if let Some(cats) = doc
            .get(key)
            .and_then(|d| d.get("test_categories"))
            .and_then(Value::as_array)
        {
            for cat in cats {
                if let Some(tests) = cat.get("tests").and_then(Value::as_array) {
                    out.extend(tests.iter());
                }
            }
        }
    }
    if let Some(tests) = doc.get("tests").and_then(Value::as_array) {
        out.extend(tests.iter());
    }
    out
}

/// A DCGM status word as a verdict; anything unknown is "not run" (never a pass).
fn verdict(status: &str) -> &'static str {
    match status.trim().to_ascii_lowercase().as_str() {
        "pass" | "passed" => PASS,
        "warn" | "warning" => WARN,
        "fail" | "failed" => FAIL,
        _ => NOT_RUN,
    }
}

fn rank(v: &str) -> u8 {
    match v {
        FAIL => 3,
        WARN => 2,
        NOT_RUN => 1,
        _ => 0,
    }
}

fn gpu_of(r: &Value) -> String {
    for key in ["entity_id", "gpu_id", "gpu_ids"] {
        match r.get(key) {
            Some(Value::Number(n)) => return n.to_string(),
            Some(Value::String(s)) => return s.clone(),
            _ => {}
        }
    }
    "?".into()
}

fn texts(r: &Value, key: &str) -> Vec<String> {
    r.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|w| match w {
                    Value::String(s) => Some(s.clone()),
                    other => other
                        .get("warning")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// One test as a result: the worst status over its GPUs; the GPUs that did not pass and
/// DCGM's own words in the detail.
fn fold(test: &Value) -> CheckResult {
    let raw = test
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("unnamed");
    let name: String = raw
        .trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(64)
        .collect();
    let results = test
        .get("results")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut worst = if results.is_empty() { NOT_RUN } else { PASS };
    let mut notes = Vec::new();
    let mut statuses = Vec::new();
    for r in &results {
        let status = r.get("status").and_then(Value::as_str).unwrap_or("");
        let v = verdict(status);
        if rank(v) > rank(worst) {
            worst = v;
        }
        statuses.push(format!(
            "GPU {}: {}",
            gpu_of(r),
            if status.is_empty() {
                "no status"
            } else {
                status
            }
        ));
        if v != PASS {
            let mut words = texts(r, "warnings");
            words.extend(texts(r, "info"));
            if !words.is_empty() {
                notes.push(format!("GPU {}: {}", gpu_of(r), words.join(" ")));
            }
        }
    }
    let value: String = statuses.join(", ").chars().take(500).collect();
    let detail = if notes.is_empty() {
        format!(
            "DCGM test '{raw}': {}",
            if results.is_empty() {
                "no result"
            } else {
                worst
            }
        )
    } else {
        format!("DCGM test '{raw}': {}", notes.join("; "))
            .chars()
            .take(1000)
            .collect()
    };
    result(
        &format!("dcgm_diag:{name}"),
        "",
        worst,
        value,
        "Pass on every GPU",
        detail,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // The DCGM 3.x shape as dcgmi prints it (banner first), from DCGM's JsonOutput.h.
    const DCGM3: &str = r#"Successfully ran diagnostic for group.
{
  "DCGM GPU Diagnostic" : {
    "test_categories" : [
      { "category" : "Deployment",
        "tests" : [
          { "name" : "Denylist", "results" : [ { "gpu_ids" : "0,1", "status" : "Pass" } ] },
          { "name" : "Persistence Mode", "results" : [ { "gpu_ids" : "0,1", "status" : "Skip" } ] }
        ] },
      { "category" : "Hardware",
        "tests" : [
          { "name" : "GPU Memory", "results" : [
              { "gpu_id" : "0", "status" : "Pass" },
              { "gpu_id" : "1", "status" : "Fail",
                "warnings" : [ "Error using CUDA API cudaMalloc" ], "info" : [ "Allocated 0 bytes" ] } ] }
        ] }
    ],
    "version" : "3.3.9"
  }
}"#;

    // DCGM 4.x: "DCGM Diagnostic", entity ids, structured warnings.
    const DCGM4: &str = r#"{
  "DCGM Diagnostic" : { "test_categories" : [ { "category" : "Deployment", "tests" : [
    { "name" : "software", "results" : [
      { "entity_group" : "GPU", "entity_group_id" : 1, "entity_id" : 0, "status" : "Warn",
        "warnings" : [ { "error_id" : 29, "warning" : "Persistence mode for GPU 0 is disabled." } ] } ] },
    { "name" : "pcie", "results" : [ { "entity_group" : "GPU", "entity_id" : 0, "status" : "pass" } ] },
    { "name" : "targeted stress", "results" : [ { "entity_id" : 0, "status" : "Not Run" } ] }
  ] } ] },
  "metadata" : { "version" : "4.2.3" }
}"#;

    #[test]
    fn dcgm3_documents_fold_each_test_with_its_worst_gpu() {
        let r = parse(DCGM3).unwrap();
        let names: Vec<&str> = r.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "dcgm_diag:denylist",
                "dcgm_diag:persistence_mode",
                "dcgm_diag:gpu_memory"
            ]
        );
        assert_eq!(r[0].verdict, PASS);
        assert_eq!(r[1].verdict, NOT_RUN, "a skipped test did not run");
        assert_eq!(r[2].verdict, FAIL);
        assert_eq!(r[2].value, "GPU 0: Pass, GPU 1: Fail");
        assert!(
            r[2].detail
                .contains("GPU 1: Error using CUDA API cudaMalloc Allocated 0 bytes"),
            "{}",
            r[2].detail
        );
    }

    #[test]
    fn dcgm4_documents_and_unknown_statuses() {
        let r = parse(DCGM4).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(
            (r[0].name.as_str(), r[0].verdict.as_str()),
            ("dcgm_diag:software", WARN)
        );
        assert!(r[0]
            .detail
            .contains("Persistence mode for GPU 0 is disabled"));
        assert_eq!(r[1].verdict, PASS);
        assert_eq!(
            (r[2].name.as_str(), r[2].verdict.as_str()),
            ("dcgm_diag:targeted_stress", NOT_RUN)
        );
        let odd = parse(r#"{"tests":[{"name":"x","results":[{"entity_id":0,"status":"Inconclusive"}]},{"name":"y"}]}"#).unwrap();
        assert!(odd.iter().all(|c| c.verdict == NOT_RUN), "{odd:?}");
    }

    #[test]
    fn output_that_is_no_document_is_an_error_not_a_pass() {
        assert!(parse("Error: unable to connect to host engine")
            .unwrap_err()
            .contains("no JSON"));
        assert!(parse("{not json}").unwrap_err().contains("not JSON"));
        assert!(parse(r#"{"version":"4.2.3"}"#)
            .unwrap_err()
            .contains("no test"));
    }

    #[test]
    fn an_absent_dcgmi_is_not_run() {
        if find_dcgmi().is_some() {
            return; // this host has DCGM
        }
        let r = run(Level::Quick);
        assert_eq!(r.len(), 1);
        assert_eq!(
            (r[0].name.as_str(), r[0].verdict.as_str()),
            ("dcgm_diag", NOT_RUN)
        );
        assert!(r[0].detail.contains("dcgmi not installed"));
    }
}
