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
            Error::Internal(m) => tonic::Status::internal(m),
        }
    }
}

/// A storage failure: logged in full, reported as INTERNAL.
pub fn db_error(e: rusqlite::Error) -> tonic::Status {
    tracing::error!(error = %e, "database error");
    tonic::Status::internal(format!("state database error: {e}"))
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
}
