//! The address of a PostgreSQL store (postgres://user:password@host:port/db): from
//! GPUFLEET_DATABASE_URL or a file for this user only, never from the command line, where
//! every local user could read its password.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::Context;

/// The environment variable that holds the database's address.
pub const ENV: &str = "GPUFLEET_DATABASE_URL";

/// The address from `file` (`--database-file`, 0600), or from [`ENV`].
pub fn read(file: Option<&Path>) -> anyhow::Result<String> {
    let url = match file {
        Some(file) => {
            let mode = std::fs::metadata(file)
                .with_context(|| format!("--database-file {}", file.display()))?
                .permissions()
                .mode();
            anyhow::ensure!(
                mode & 0o077 == 0,
                "--database-file {}: mode {:o} lets others read the database's password; chmod 600 it",
                file.display(),
                mode & 0o777
            );
            std::fs::read_to_string(file)
                .with_context(|| format!("--database-file {}", file.display()))?
                .trim()
                .to_string()
        }
        None => std::env::var(ENV).map_err(|_| {
            anyhow::anyhow!(
                "no PostgreSQL database named: set {ENV} to postgres://user:password@host:port/db, or give --database-file"
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
