//! The child-process protocol of MIG slices' load tests on CUDA. CUDA shows a process
//! only the MIG slices named in its `CUDA_VISIBLE_DEVICES`, read once when it starts, so
//! the agent tests each slice in a child of its own (`gpufleet-agent load-probe ARGS`,
//! with `CUDA_VISIBLE_DEVICES=MIG-...`): the arguments say the test and the plan, the
//! child answers one line. Pure text both ways, so both ends are tested without a GPU.
//!
//! Arguments: `TEST MEMORY_MIB FRACTION PASSES BURN_MS BYTES SEED`, TEST one of
//! `memory`, `burn-bf16`, `burn-fp16`, `copy`, `host`. Answers:
//! `ok memory BYTES WORDS MISMATCHES PATTERN|PATTERN...`,
//! `ok burn DTYPE N GEMMS COMPARED CORRUPTED TFLOPS SECONDS`, `ok copy GBPS`,
//! `ok host H2D D2H`, or `err SENTENCE`.

use std::time::Duration;

use super::{BurnResult, LoadPlan, MemoryResult, Outcome};
use crate::figures::Dtype;

/// One test a child runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    Memory,
    Burn(Dtype),
    Copy,
    Host,
}

/// What a child measured.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Memory(MemoryResult),
    Burn(BurnResult),
    Copy(f64),
    Host(f64, f64),
}

fn dtype_name(d: Dtype) -> &'static str {
    d.as_str()
}

fn dtype_of(s: &str) -> Result<Dtype, String> {
    match s {
        "bf16" => Ok(Dtype::Bf16),
        "fp16" => Ok(Dtype::Fp16),
        "fp32" => Ok(Dtype::Fp32),
        other => Err(format!("unknown GEMM type '{other}'")),
    }
}

/// The child's arguments (after `load-probe`).
pub fn args(test: Test, memory_mib: u64, plan: &LoadPlan) -> Vec<String> {
    let test = match test {
        Test::Memory => "memory".to_string(),
        Test::Burn(d) => format!("burn-{}", dtype_name(d)),
        Test::Copy => "copy".to_string(),
        Test::Host => "host".to_string(),
    };
    vec![
        test,
        memory_mib.to_string(),
        plan.memory_fraction.to_string(),
        plan.memory_passes.to_string(),
        plan.burn.as_millis().to_string(),
        plan.bandwidth_bytes.to_string(),
        plan.seed.to_string(),
    ]
}

/// The test, the slice's memory and the plan, from the child's arguments (the plan held
/// to its bounds).
pub fn parse_args(args: &[String]) -> Result<(Test, u64, LoadPlan), String> {
    let [test, mib, fraction, passes, burn_ms, bytes, seed] = args else {
        return Err(format!(
            "load-probe: give TEST MEMORY_MIB FRACTION PASSES BURN_MS BYTES SEED ({} given)",
            args.len()
        ));
    };
    let num = |what: &str, v: &str| -> Result<u64, String> {
        v.parse()
            .map_err(|_| format!("load-probe: {what} '{v}' is not a number"))
    };
    let test = match test.as_str() {
        "memory" => Test::Memory,
        "copy" => Test::Copy,
        "host" => Test::Host,
        t => match t.strip_prefix("burn-") {
            Some(d) => Test::Burn(dtype_of(d)?),
            None => return Err(format!("load-probe: unknown test '{t}'")),
        },
    };
    let plan = LoadPlan {
        memory_fraction: fraction
            .parse()
            .map_err(|_| format!("load-probe: fraction '{fraction}' is not a number"))?,
        memory_passes: num("passes", passes)? as u32,
        burn: Duration::from_millis(num("burn", burn_ms)?),
        bandwidth_bytes: num("bytes", bytes)?,
        seed: num("seed", seed)?,
    }
    .bounded();
    Ok((test, num("memory", mib)?, plan))
}

/// The child's one line.
pub fn answer_line(answer: &Outcome<Answer>) -> String {
    match answer {
        Ok(Answer::Memory(m)) => format!(
            "ok memory {} {} {} {}",
            m.bytes,
            m.words_checked,
            m.mismatches,
            m.patterns.join("|").replace(' ', "_")
        ),
        Ok(Answer::Burn(b)) => format!(
            "ok burn {} {} {} {} {} {} {}",
            dtype_name(b.dtype),
            b.n,
            b.gemms,
            b.compared,
            b.corrupted,
            b.tflops,
            b.seconds
        ),
        Ok(Answer::Copy(g)) => format!("ok copy {g}"),
        Ok(Answer::Host(a, b)) => format!("ok host {a} {b}"),
        Err(why) => format!("err {}", why.replace('\n', " ")),
    }
}

/// The answer in a child's output (its last line that starts with `ok` or `err`).
pub fn parse_answer(output: &str) -> Outcome<Answer> {
    let line = output
        .lines()
        .rev()
        .find(|l| l.starts_with("ok ") || l.starts_with("err "))
        .ok_or_else(|| {
            format!(
                "the slice's test process answered nothing: {}",
                tail(output)
            )
        })?;
    if let Some(why) = line.strip_prefix("err ") {
        return Err(why.to_string());
    }
    let w: Vec<&str> = line.split_whitespace().collect();
    let bad = || format!("the slice's test process answered '{}'", tail(line));
    let n = |i: usize| -> Outcome<u64> { w.get(i).and_then(|v| v.parse().ok()).ok_or_else(bad) };
    let f = |i: usize| -> Outcome<f64> { w.get(i).and_then(|v| v.parse().ok()).ok_or_else(bad) };
    match w.get(1).copied() {
        Some("memory") => Ok(Answer::Memory(MemoryResult {
            bytes: n(2)?,
            words_checked: n(3)?,
            mismatches: n(4)?,
            patterns: w
                .get(5)
                .map(|p| p.split('|').map(|s| s.replace('_', " ")).collect())
                .unwrap_or_default(),
        })),
        Some("burn") => Ok(Answer::Burn(BurnResult {
            dtype: dtype_of(w.get(2).copied().unwrap_or_default()).map_err(|_| bad())?,
            n: n(3)? as u32,
            gemms: n(4)?,
            compared: n(5)?,
            corrupted: n(6)?,
            tflops: f(7)?,
            seconds: f(8)?,
        })),
        Some("copy") => Ok(Answer::Copy(f(2)?)),
        Some("host") => Ok(Answer::Host(f(2)?, f(3)?)),
        _ => Err(bad()),
    }
}

fn tail(s: &str) -> String {
    let t: Vec<char> = s.trim().chars().collect();
    t[t.len().saturating_sub(200)..].iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> LoadPlan {
        LoadPlan {
            memory_fraction: 0.5,
            memory_passes: 2,
            burn: Duration::from_millis(1500),
            bandwidth_bytes: 1 << 30,
            seed: 42,
        }
    }

    #[test]
    fn arguments_go_there_and_back() {
        for test in [
            Test::Memory,
            Test::Burn(Dtype::Bf16),
            Test::Copy,
            Test::Host,
        ] {
            let a = args(test, 33_280, &plan());
            assert_eq!(parse_args(&a).unwrap(), (test, 33_280, plan()));
        }
        assert!(parse_args(&["memory".into()])
            .unwrap_err()
            .contains("TEST MEMORY_MIB"));
        let mut a = args(Test::Copy, 1, &plan());
        a[0] = "dance".into();
        assert!(parse_args(&a).unwrap_err().contains("unknown test 'dance'"));
    }

    #[test]
    fn answers_go_there_and_back() {
        let answers = [
            Answer::Memory(MemoryResult {
                bytes: 1 << 30,
                words_checked: 3 << 28,
                mismatches: 2,
                patterns: vec!["walking ones".into(), "random seed 42".into()],
            }),
            Answer::Burn(BurnResult {
                dtype: Dtype::Bf16,
                n: 8192,
                gemms: 41,
                compared: 40,
                corrupted: 0,
                tflops: 101.5,
                seconds: 10.25,
            }),
            Answer::Copy(1234.5),
            Answer::Host(50.1, 55.3),
        ];
        for a in answers {
            let line = answer_line(&Ok(a.clone()));
            assert_eq!(
                parse_answer(&format!("noise\n{line}\n")).unwrap(),
                a,
                "{line}"
            );
        }
        let why = "not run: no CUDA library: libcuda not found";
        assert_eq!(
            parse_answer(&answer_line(&Err(why.into()))),
            Err(why.into())
        );
        assert!(parse_answer("panic!")
            .unwrap_err()
            .contains("answered nothing"));
        assert!(parse_answer("ok burn x")
            .unwrap_err()
            .contains("answered 'ok burn x'"));
    }
}
