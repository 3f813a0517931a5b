//! Errors as data: a refusal of a request (INVALID_ARGUMENT, FAILED_PRECONDITION,
//! OUT_OF_RANGE, ALREADY_EXISTS) carries google.rpc error details, so a client learns which
//! request field it is about and why without reading the sentence, which is for people:
//!
//! * `google.rpc.ErrorInfo`: `reason` (a machine-readable code, see [`reason`]) and
//!   `domain` [`DOMAIN`];
//! * `google.rpc.BadRequest` with one `FieldViolation { field, description }` when the
//!   message starts with a field path (the backend's convention: `node_count: needs 3
//!   A100-80GB nodes ...`, `acceptance.min_bus_bandwidth_gbps: ...`); none otherwise.
//!
//! The details are added once, at the API edge, by the layer in `short_errors` (which
//! sees every response, whoever made its status); a status that already has details keeps
//! them.

use std::collections::HashMap;

use gpufleet_proto::error_info::{EXISTING_FIELD, EXISTING_ID, USED_BY};

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::message_cut::{cut, MAX_CUT_MESSAGE_BYTES};

/// The `ErrorInfo.domain` of every refusal.
pub const DOMAIN: &str = "gpufleet";

/// The longest field path a message prefix may be taken for.
pub const MAX_FIELD_BYTES: usize = 64;

/// The `ErrorInfo.reason` of a refusal, from its code; None for a status that is not a
/// refusal of the request (NOT_FOUND, transport, authentication, internal errors).
pub fn reason(code: Code) -> Option<&'static str> {
    match code {
        Code::InvalidArgument => Some("INVALID_ARGUMENT"),
        Code::FailedPrecondition => Some("FAILED_PRECONDITION"),
        Code::OutOfRange => Some("OUT_OF_RANGE"),
        Code::AlreadyExists => Some("ALREADY_EXISTS"),
        _ => None,
    }
}

/// The request field a message is about and the rest of it, when the message starts with
/// a plausible field path and a colon (`[a-z0-9_]+` segments joined by dots, each
/// followed by any `[N]` list indexes, as in `ssh_public_keys[2]`: AIP-193's paths; at
/// most [`MAX_FIELD_BYTES`]); None for a message that names no field that way.
pub fn field_of(message: &str) -> Option<(&str, &str)> {
    let (field, rest) = message.split_once(':')?;
    let name = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    let index = |s: &str| {
        s.strip_suffix(']')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let segment = |s: &str| {
        let mut parts = s.split('[');
        parts.next().is_some_and(name) && parts.all(index)
    };
    let plausible = field.len() <= MAX_FIELD_BYTES && field.split('.').all(segment);
    plausible.then(|| (field, rest.trim_start()))
}

/// The details of a refusal with `code` and `message`; None when it is not a refusal.
pub fn details(code: Code, message: &str) -> Option<ErrorDetails> {
    let reason = reason(code)?;
    let violation = field_of(message)
        .map(|(field, rest)| (field, if rest.is_empty() { message } else { rest }));
    Some(with_reason(reason, violation))
}

/// `ErrorInfo` with `reason`, and the `BadRequest` of `violation` (field, description)
/// when there is one; the description bounded like a message.
fn with_reason(reason: &str, violation: Option<(&str, &str)>) -> ErrorDetails {
    let mut details = ErrorDetails::with_error_info(reason, DOMAIN, HashMap::new());
    if let Some((field, description)) = violation {
        details.add_bad_request_violation(field, cut(description, MAX_CUT_MESSAGE_BYTES));
    }
    details
}

/// A refusal about `field` whose sentence does not start with it (it reads better as
/// prose): the details name the field all the same.
pub fn refusal_on(code: Code, field: &str, message: impl Into<String>) -> Status {
    let message = message.into();
    let details = with_reason(
        reason(code).unwrap_or("INVALID_ARGUMENT"),
        Some((field, &message)),
    );
    Status::with_error_details(code, message, details)
}

/// [`refusal_on`] with `ErrorInfo` metadata a client acts on (e.g.
/// [`gpufleet_proto::error_info::OVER_POOL`]).
pub fn refusal_with(
    code: Code,
    field: &str,
    message: impl Into<String>,
    metadata: &[(&str, String)],
) -> Status {
    let message = message.into();
    let metadata: HashMap<String, String> = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let reason = reason(code).unwrap_or("INVALID_ARGUMENT");
    let mut details = ErrorDetails::with_error_info(reason, DOMAIN, metadata);
    let description = field_of(&message).map_or(message.as_str(), |(_, rest)| rest);
    details.add_bad_request_violation(field, cut(description, MAX_CUT_MESSAGE_BYTES));
    Status::with_error_details(code, message, details)
}

/// ALREADY_EXISTS about `field`, naming (in its `ErrorInfo`, so a client planning the
/// replacement of that very object may go on) the id of the object that already has it.
pub fn already_exists(field: &str, message: impl Into<String>, existing_id: &str) -> Status {
    let message = message.into();
    let metadata = HashMap::from([
        (EXISTING_ID.to_string(), existing_id.to_string()),
        (EXISTING_FIELD.to_string(), field.to_string()),
    ]);
    let mut details = ErrorDetails::with_error_info("ALREADY_EXISTS", DOMAIN, metadata);
    let description = field_of(&message).map_or(message.as_str(), |(_, rest)| rest);
    details.add_bad_request_violation(field, cut(description, MAX_CUT_MESSAGE_BYTES));
    Status::with_error_details(Code::AlreadyExists, message, details)
}

/// FAILED_PRECONDITION for a delete of what `ids` still use (in its `ErrorInfo`, so a
/// client deleting those too in the same run may go on).
pub fn used_by(message: impl Into<String>, ids: &[&str]) -> Status {
    used_by_with(message, ids, &[])
}

/// [`used_by`] with more `ErrorInfo` metadata (e.g. which of the ids are quotas).
pub fn used_by_with(message: impl Into<String>, ids: &[&str], more: &[(&str, String)]) -> Status {
    let message = message.into();
    let mut metadata = HashMap::from([(USED_BY.to_string(), ids.join(","))]);
    metadata.extend(more.iter().map(|(k, v)| (k.to_string(), v.clone())));
    let details = ErrorDetails::with_error_info("FAILED_PRECONDITION", DOMAIN, metadata);
    Status::with_error_details(Code::FailedPrecondition, message, details)
}

/// Two refusals of one request said at once: `first`'s code, both sentences, and each one's
/// field violation (`first`'s, then `second`'s), with the `ErrorInfo` metadata of both
/// (`first`'s where both have a key). A `first` that is not a refusal (internal,
/// transport) is returned as it is.
pub fn together(first: Status, second: Status) -> Status {
    let Some(reason) = reason(first.code()) else {
        return first;
    };
    let violation = |s: &Status| {
        s.get_details_bad_request()
            .and_then(|b| b.field_violations.into_iter().next())
            .map(|v| (v.field, v.description))
            .or_else(|| field_of(s.message()).map(|(f, r)| (f.to_string(), r.to_string())))
    };
    let metadata_of = |s: &Status| {
        s.get_details_error_info()
            .map(|i| i.metadata)
            .unwrap_or_default()
    };
    let mut metadata = metadata_of(&second);
    metadata.extend(metadata_of(&first));
    let mut details = ErrorDetails::with_error_info(reason, DOMAIN, metadata);
    for (field, description) in [violation(&first), violation(&second)]
        .into_iter()
        .flatten()
    {
        details.add_bad_request_violation(field, cut(&description, MAX_CUT_MESSAGE_BYTES));
    }
    let message = format!("{}; {}", first.message(), second.message());
    Status::with_error_details(first.code(), message, details)
}

/// A status's `details` bytes (an encoded `google.rpc.Status`, what travels base64-encoded
/// in `grpc-status-details-bin`) for a refusal; None when it is not a refusal.
pub fn encoded(code: Code, message: &str) -> Option<Vec<u8>> {
    let details = details(code, message)?;
    Some(
        Status::with_error_details(code, message, details)
            .details()
            .to_vec(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(code: Code, message: &str) -> Status {
        let bytes = encoded(code, message).expect("a refusal");
        Status::with_details(code, message, bytes.into())
    }

    #[test]
    fn a_field_prefix_becomes_the_field_violation() {
        let s = decoded(
            Code::FailedPrecondition,
            "node_count: needs 3 A100-80GB nodes, 2 are free",
        );
        let violations = s
            .get_details_bad_request()
            .expect("BadRequest")
            .field_violations;
        assert_eq!(violations.len(), 1);
        assert_eq!(violations[0].field, "node_count");
        assert_eq!(
            violations[0].description,
            "needs 3 A100-80GB nodes, 2 are free"
        );
        let info = s.get_details_error_info().expect("ErrorInfo");
        assert_eq!(
            (info.reason.as_str(), info.domain.as_str()),
            ("FAILED_PRECONDITION", "gpufleet")
        );
    }

    #[test]
    fn a_refusal_in_prose_names_its_field_in_the_details() {
        let s = refusal_on(
            Code::FailedPrecondition,
            "storage_gib",
            "storage_gib cannot shrink from 300 to 50",
        );
        assert_eq!(s.message(), "storage_gib cannot shrink from 300 to 50");
        let violations = s
            .get_details_bad_request()
            .expect("BadRequest")
            .field_violations;
        assert_eq!(violations[0].field, "storage_gib");
        let info = s.get_details_error_info().expect("ErrorInfo");
        assert_eq!(info.reason, "FAILED_PRECONDITION");
    }

    #[test]
    fn dotted_paths_are_fields_and_other_prefixes_are_not() {
        assert_eq!(
            field_of("acceptance.min_bus_bandwidth_gbps: must be between 0 and 100000"),
            Some((
                "acceptance.min_bus_bandwidth_gbps",
                "must be between 0 and 100000"
            ))
        );
        assert_eq!(
            field_of("tenant_id: required"),
            Some(("tenant_id", "required"))
        );
        assert_eq!(
            field_of("ssh_public_keys[2]: not an OpenSSH public key"),
            Some(("ssh_public_keys[2]", "not an OpenSSH public key"))
        );
        assert_eq!(
            field_of("inventory.gpus[0].index: GPUs are listed in index order"),
            Some(("inventory.gpus[0].index", "GPUs are listed in index order"))
        );
        for message in [
            "needs 24 H100-80GB GPUs, quota leaves 16",
            "tenant 'x' still has 1 gpu quota(s): delete them first",
            "storage_gib cannot shrink from 300 to 50",
            "Node_count: capitalised",
            "keys[]: empty index",
            "keys[a]: not a number",
            "keys[1: unclosed",
            "[1]: no name",
            "a..b: empty segment",
            ".a: leading dot",
            ": no name",
            "no colon at all",
        ] {
            assert_eq!(field_of(message), None, "{message}");
        }
        let long = format!("{}: too long for a field", "a".repeat(MAX_FIELD_BYTES + 1));
        assert_eq!(field_of(&long), None);
        let longest = format!("{}: fits", "a".repeat(MAX_FIELD_BYTES));
        assert_eq!(
            field_of(&longest).map(|(f, _)| f.len()),
            Some(MAX_FIELD_BYTES)
        );
    }

    #[test]
    fn each_refusal_code_has_its_reason_and_others_get_no_details() {
        for (code, reason) in [
            (Code::InvalidArgument, "INVALID_ARGUMENT"),
            (Code::FailedPrecondition, "FAILED_PRECONDITION"),
            (Code::OutOfRange, "OUT_OF_RANGE"),
            (Code::AlreadyExists, "ALREADY_EXISTS"),
        ] {
            let s = decoded(code, "name: taken");
            assert_eq!(s.get_details_error_info().unwrap().reason, reason);
        }
        for code in [
            Code::NotFound,
            Code::Internal,
            Code::Unauthenticated,
            Code::PermissionDenied,
            Code::Aborted,
            Code::Unavailable,
            Code::Ok,
        ] {
            assert!(encoded(code, "name: x").is_none(), "{code:?}");
        }
    }

    #[test]
    fn a_long_description_is_cut_like_the_message() {
        let message = format!("mig_layout: {}", "é".repeat(4 * MAX_CUT_MESSAGE_BYTES));
        let s = decoded(Code::InvalidArgument, &message);
        let violation = &s.get_details_bad_request().unwrap().field_violations[0];
        assert_eq!(violation.field, "mig_layout");
        assert!(violation.description.len() <= MAX_CUT_MESSAGE_BYTES + 64);
        assert!(violation.description.contains("(message cut:"));
    }
}
