//! `gpufleet-agent migrate`: the control plane's SQLite store copied into an empty
//! PostgreSQL database (`gpufleet_control::store::to_postgres`), with serve stopped.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::Context;

use crate::cli::MigrateArgs;

/// The environment variable that holds the database's address.
pub const DATABASE_URL_ENV: &str = "GPUFLEET_DATABASE_URL";

pub async fn run(args: MigrateArgs) -> anyhow::Result<()> {
    let url = database_url(args.to_file.as_deref())?;
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

/// The address from `--to-file` (a file for this user only), or from the environment.
fn database_url(file: Option<&Path>) -> anyhow::Result<String> {
    let url = match file {
        Some(file) => {
            let mode = std::fs::metadata(file)
                .with_context(|| format!("--to-file {}", file.display()))?
                .permissions()
                .mode();
            anyhow::ensure!(
                mode & 0o077 == 0,
                "--to-file {}: mode {:o} lets others read the database's password; chmod 600 it",
                file.display(),
                mode & 0o777
            );
            std::fs::read_to_string(file)
                .with_context(|| format!("--to-file {}", file.display()))?
                .trim()
                .to_string()
        }
        None => std::env::var(DATABASE_URL_ENV).map_err(|_| {
            anyhow::anyhow!(
                "no database to copy into: set {DATABASE_URL_ENV} to postgres://user:password@host:port/db, or give --to-file"
            )
        })?,
    };
    anyhow::ensure!(
        gpufleet_sql::database::is_postgres(&url),
        "'{}' is not a PostgreSQL address: postgres://user:password@host:port/db",
        gpufleet_sql::database::redacted(&url)
    );
    Ok(url)
}
