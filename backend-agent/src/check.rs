//! `gpufleet-agent check`: the store's invariants (`gpufleet_control::invariants`) on a
//! data dir's state database, read-only, printed one violation a line.

use anyhow::Context;

use crate::cli::CheckArgs;

/// Prints each violation and fails when there is any; prints what was checked when
/// there is none.
pub async fn run(args: CheckArgs) -> anyhow::Result<()> {
    let (path, url) = if args.postgres {
        let url = crate::database_url::read(args.database_file.as_deref())?;
        (gpufleet_sql::database::redacted(&url), Some(url))
    } else {
        let path = args
            .store
            .clone()
            .unwrap_or_else(|| args.data_dir.join("state.db"));
        (path.display().to_string(), None)
    };
    let answers = match &args.answers {
        Some(file) => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("--answers {}", file.display()))?;
            let parsed = gpufleet_control::invariants::answers::parse(&text)
                .map_err(|e| anyhow::anyhow!("--answers {}: {e}", file.display()))?;
            Some(parsed)
        }
        None => None,
    };
    let now = match &args.clock_file {
        Some(file) => gpufleet_control::clock::Clock::File(file.clone()),
        None => gpufleet_control::clock::Clock::System,
    }
    .now();
    let count = answers.as_ref().map_or(0, Vec::len);
    // SQLite reads block: off the async workers.
    let checked = args
        .store
        .clone()
        .unwrap_or_else(|| args.data_dir.join("state.db"));
    let violations = tokio::task::spawn_blocking(move || match url {
        Some(url) => {
            let mut db = gpufleet_sql::Database::postgres(&url)?;
            gpufleet_control::invariants::check_database(&mut db, now, answers.as_deref())
        }
        None => gpufleet_control::invariants::check_store(&checked, now, answers.as_deref()),
    })
    .await??;
    for v in &violations {
        println!("{v}");
    }
    if !violations.is_empty() {
        anyhow::bail!(
            "{}: {} violation{}",
            path,
            violations.len(),
            if violations.len() == 1 { "" } else { "s" }
        );
    }
    let answered = if args.answers.is_some() {
        format!(", and the {count} acknowledged answers hold")
    } else {
        String::new()
    };
    println!(
        "{}: no violation (capacity, quota, membership, sequences){answered}",
        path
    );
    Ok(())
}
