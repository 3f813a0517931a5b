//! `gpufleet-agent migrate`: the control plane's SQLite store copied into an empty
//! PostgreSQL database (`gpufleet_control::store::to_postgres`), with serve stopped.

use std::path::Path;

use anyhow::Context;

use crate::cli::MigrateArgs;

pub async fn run(args: MigrateArgs) -> anyhow::Result<()> {
    let url = crate::database_url::read(args.database_file.as_deref())?;
    let data_dir = args.data_dir;
    // SQLite, PostgreSQL and the copy block: off the async workers.
    tokio::task::spawn_blocking(move || copy(&data_dir, &url)).await?
}

fn copy(data_dir: &Path, url: &str) -> anyhow::Result<()> {
    let path = data_dir.join("state.db");
    anyhow::ensure!(
        path.is_file(),
        "no store to copy: {} does not exist (--data-dir is serve's data dir)",
        path.display()
    );
    // serve holds this lock while it runs: a store being written is not copied.
    let _lock = gpufleet_process::data_dir::DataDirLock::acquire(data_dir)
        .context("stop serve before migrating its store")?;
    let mut sqlite = gpufleet_control::store::open(&path)?;
    let shown = gpufleet_sql::database::redacted(url);
    let mut pg =
        gpufleet_sql::Database::postgres(url).with_context(|| format!("connecting to {shown}"))?;
    let now = gpufleet_control::clock::Clock::System.now();
    let copied = gpufleet_control::store::to_postgres::copy(&mut sqlite, &mut pg, now)
        .with_context(|| {
            format!(
                "copying {} into {shown}; nothing was written",
                path.display()
            )
        })?;
    println!("{:<24} {:>10}", "TABLE", "ROWS");
    for (table, rows) in &copied.tables {
        println!("{table:<24} {rows:>10}");
    }
    println!(
        "copied {} rows of {} tables from {} into {shown}; the counters agree",
        copied.rows(),
        copied.tables.len(),
        path.display()
    );
    Ok(())
}
