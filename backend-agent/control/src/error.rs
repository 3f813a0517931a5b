//! The domain's error: what rules, scheduling and MIG code return. It becomes a gRPC
//! status once, at the API edge (`From<Error> for tonic::Status`), so the domain never
//! names a transport. The edge's layer (`services::short_errors`) then gives every refusal
//! the field its message names and a reason as google.rpc error details
//! (`services::error_details`).

/// Every variant's text is the sentence the user sees (it names the field and, for
/// capacity and quota, the numbers).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed (INVALID_ARGUMENT).
    #[error("{0}")]
    Invalid(String),
    /// The object does not exist, or the caller may not see it (NOT_FOUND).
    #[error("{0}")]
    NotFound(String),
    /// The request is valid but the system's state refuses it now (FAILED_PRECONDITION).
    #[error("{0}")]
    Precondition(String),
    /// A change failed part-way and was put back (ABORTED): retrying may work.
    #[error("{0}")]
    Aborted(String),
    #[error("state database error: {0}")]
    Store(#[from] rusqlite::Error),
    /// A part the request needs has stopped (UNAVAILABLE): the state writer at shutdown.
    #[error("{0}")]
    Unavailable(String),
    /// The data dir's disk is full (RESOURCE_EXHAUSTED): nothing was written, and the same
    /// request works once there is room.
    #[error("{0}")]
    DiskFull(String),
    /// Something that should not happen (INTERNAL).
    #[error("{0}")]
    Internal(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        match e {
            Error::Invalid(m) => tonic::Status::invalid_argument(m),
            Error::NotFound(m) => tonic::Status::not_found(m),
            Error::Precondition(m) => tonic::Status::failed_precondition(m),
            Error::Aborted(m) => tonic::Status::aborted(m),
            Error::Store(e) => db_error(e),
            Error::Unavailable(m) => tonic::Status::unavailable(m),
            Error::DiskFull(m) => tonic::Status::resource_exhausted(m),
            Error::Internal(m) => tonic::Status::internal(m),
        }
    }
}

/// A store function already on the engine seam (`gpufleet_sql`), called where the rest
/// still speaks rusqlite: SQLite's errors stay SQLite's (disk full among them).
impl From<gpufleet_sql::Error> for Error {
    fn from(e: gpufleet_sql::Error) -> Self {
        Error::Store(e.into())
    }
}

/// A storage failure: logged in full, reported as RESOURCE_EXHAUSTED when the disk is
/// full (SQLITE_FULL: a write hit ENOSPC) and as INTERNAL otherwise, with the same text.
/// Takes the engine seam's errors too (`gpufleet_sql`), SQLite's within them unchanged.
pub fn db_error(e: impl Into<rusqlite::Error>) -> tonic::Status {
    let e: rusqlite::Error = e.into();
    tracing::error!(error = %e, "database error");
    let text = format!("state database error: {e}");
    if is_disk_full(&e) {
        tonic::Status::resource_exhausted(text)
    } else {
        tonic::Status::internal(text)
    }
}

/// Whether SQLite failed for want of disk space.
pub fn is_disk_full(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
}

#[cfg(test)]
mod tests {
    use super::Error;

    #[test]
    fn each_kind_becomes_its_status_with_the_same_text() {
        let cases = [
            (Error::Invalid("a".into()), tonic::Code::InvalidArgument),
            (Error::NotFound("b".into()), tonic::Code::NotFound),
            (
                Error::Precondition("c".into()),
                tonic::Code::FailedPrecondition,
            ),
            (Error::Aborted("d".into()), tonic::Code::Aborted),
            (Error::Internal("e".into()), tonic::Code::Internal),
        ];
        for (e, code) in cases {
            let text = e.to_string();
            let s = tonic::Status::from(e);
            assert_eq!((s.code(), s.message()), (code, text.as_str()));
        }
        let store = tonic::Status::from(Error::Store(rusqlite::Error::InvalidQuery));
        assert_eq!(store.code(), tonic::Code::Internal);
    }

    /// What SQLite answers when a write hits ENOSPC.
    fn disk_full() -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            Some("database or disk is full".into()),
        )
    }

    #[test]
    fn a_full_disk_is_resource_exhausted_with_the_same_text() {
        for status in [
            tonic::Status::from(Error::Store(disk_full())),
            super::db_error(disk_full()),
            tonic::Status::from(Error::DiskFull(
                "state database error: database or disk is full".into(),
            )),
        ] {
            assert_eq!(status.code(), tonic::Code::ResourceExhausted);
            assert_eq!(
                status.message(),
                "state database error: database or disk is full"
            );
        }
        let other = super::db_error(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
            Some("disk I/O error".into()),
        ));
        assert_eq!(other.code(), tonic::Code::Internal);
    }
}
