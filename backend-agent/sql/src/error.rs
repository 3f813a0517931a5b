//! What a statement or a transaction on either engine can fail with.

/// An error of either engine, or of the values between them.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// SQLite's own words, as they were before the seam (operators and tests read them).
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error("postgres: {}", postgres_text(.0))]
    Postgres(#[from] postgres::Error),
    /// `query_row` found no row.
    #[error("no row")]
    NoRows,
    /// A column's value does not fit the type asked for.
    #[error("column {index}: {reason}")]
    Column { index: usize, reason: String },
    /// A parameter's value does not fit its column's type.
    #[error("parameter: {0}")]
    Parameter(String),
    /// A pool's connections all stayed in use.
    #[error("{0}")]
    Exhausted(String),
    /// `Database::open`'s address.
    #[error("database: {0}")]
    Address(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// PostgreSQL's SQLSTATEs for a transaction that lost a race and may be run again.
const SERIALIZATION_FAILURE: &str = "40001";
const DEADLOCK_DETECTED: &str = "40P01";

impl Error {
    /// Whether the transaction failed only because it raced another (PostgreSQL's
    /// serialization failure or deadlock, SQLite's busy or locked database), so that
    /// running it again from its start may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Postgres(e) => e
                .code()
                .is_some_and(|c| matches!(c.code(), SERIALIZATION_FAILURE | DEADLOCK_DETECTED)),
            Error::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => matches!(
                e.code,
                rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
            ),
            _ => false,
        }
    }

    /// PostgreSQL's SQLSTATE, if the server answered with one.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Error::Postgres(e) => e.code().map(|c| c.code()),
            _ => None,
        }
    }
}

/// The server's own message where it sent one ("db error" alone says nothing), else the
/// error with its causes ("error performing TLS handshake" says nothing of why).
fn postgres_text(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({}): {}", db.severity(), db.code().code(), db.message()),
        None => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(cause) = source {
                let said = cause.to_string();
                if !text.contains(&said) {
                    text.push_str(": ");
                    text.push_str(&said);
                }
                source = cause.source();
            }
            text
        }
    }
}

/// While the store moves onto this seam module by module, a ported function's error goes
/// up through callers that still return rusqlite's: SQLite's own error as it was, no row
/// as rusqlite's no row, and anything else (only PostgreSQL's, which no such caller
/// reaches) carried whole.
impl From<Error> for rusqlite::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Sqlite(e) => e,
            Error::NoRows => rusqlite::Error::QueryReturnedNoRows,
            other => rusqlite::Error::ToSqlConversionFailure(Box::new(other)),
        }
    }
}
