//! Plan-time admission without rules of the provider's own: a resource sends the create or
//! update it would send at apply with `validate_only`, the backend runs its one admission
//! path (tenant, model, quota, capacity, reservation, MIG layout, driver) and changes
//! nothing, and a refusal becomes a diagnostic on the attribute its details name (the
//! field of its `google.rpc.BadRequest`), whatever its wording.

use tonic::{Code, Response, Status};
use tonic_types::StatusExt;

use super::common::tenant_not_found;
use crate::client::Client;
use crate::framework::{AttrPath, Diagnostic, Diagnostics};

/// Wire fields that a resource spells differently.
const RENAMED: &[(&str, &str)] = &[("tenant_id", "tenant")];

/// What a dry run's answer means for the plan: admitted, or skipped because the tenant
/// does not exist yet (the same apply may create it; the real call then decides), or
/// refused with the backend's words on the attribute they are about. `attributes` are
/// the resource's attributes a refusal's field may be (or, for a dotted field, start
/// with); a refusal naming none is said on `default`.
pub(crate) fn verdict<T>(
    client: &Client,
    answer: Result<Response<T>, Status>,
    attributes: &[&str],
    default: &str,
) -> Result<(), Diagnostics> {
    match answer {
        Ok(_) => Ok(()),
        Err(s) if tenant_not_found(&s) || no_quota_yet(&s) => Ok(()),
        Err(s) => match refusal(&s, attributes, default) {
            Some(d) => Err(d.into()),
            None => Err(client.diagnostic(&s).into()),
        },
    }
}

/// Whether a refusal says the tenant has no quota for the model at all: the same apply may
/// create that quota (a quota only raised in the same plan is refused: apply it first).
fn no_quota_yet(status: &Status) -> bool {
    status.code() == Code::FailedPrecondition && status.message().contains(" has no quota for ")
}

/// The backend's refusal of a request, said on the attribute its details name (the
/// field of its `google.rpc.BadRequest`, e.g. `node_count`, `tenant_id` or
/// `acceptance.min_bus_bandwidth_gbps`) when that is one of `attributes`, else on
/// `default`; None for what is not a refusal of the request's values (transport,
/// authentication, internal errors).
pub(crate) fn refusal(status: &Status, attributes: &[&str], default: &str) -> Option<Diagnostic> {
    let refused = matches!(
        status.code(),
        Code::InvalidArgument | Code::FailedPrecondition | Code::AlreadyExists | Code::OutOfRange
    );
    if !refused {
        return None;
    }
    let message = status.message();
    let field = refused_field(status).map(|(field, _)| field);
    let attribute = field
        .as_deref()
        .and_then(|f| attribute_of(f, attributes).map(|path| (f, path)));
    Some(match attribute {
        Some((wire, path)) => {
            // The sentence says the attribute's name where the backend said the wire's.
            let name = path.to_string();
            let text = match message.strip_prefix(wire) {
                Some(rest) if rest.starts_with(':') => format!("{name}{rest}"),
                _ => format!("{name}: {message}"),
            };
            Diagnostic::error_at(path, text, "")
        }
        None => Diagnostic::error_at(AttrPath::attr(default), format!("{default}: {message}"), ""),
    })
}

/// The request field a refusal is about, from its `google.rpc.BadRequest` (None when its
/// details name none).
pub(crate) fn refused_field(status: &Status) -> Option<(String, String)> {
    status
        .get_details_bad_request()
        .and_then(|b| b.field_violations.into_iter().next())
        .map(|v| (v.field, v.description))
}

/// The attribute a wire field path is: its first step renamed where the resource spells
/// it differently, the rest nested below it (`acceptance.min_bus_bandwidth_gbps`); None
/// when the first step is not one of `attributes`.
fn attribute_of(field: &str, attributes: &[&str]) -> Option<AttrPath> {
    let mut steps = field.split('.');
    let first = steps.next()?;
    let first = RENAMED
        .iter()
        .find(|(wire, _)| *wire == first)
        .map_or(first, |(_, attr)| attr);
    if !attributes.contains(&first) || field.split('.').any(str::is_empty) {
        return None;
    }
    Some(steps.fold(AttrPath::attr(first), |path, step| path.child(step)))
}

/// A refusal as the backend's API edge sends it (tests): the field its message starts with
/// (`field: reason`) and the rest as a `google.rpc.BadRequest`, with an `ErrorInfo`.
#[cfg(test)]
pub(crate) fn as_sent(code: Code, message: &str) -> Status {
    let mut details = tonic_types::ErrorDetails::with_error_info(
        "REFUSED",
        "gpufleet",
        std::collections::HashMap::new(),
    );
    if let Some((field, rest)) = message.split_once(':') {
        let path = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        if field.split('.').all(path) {
            details.add_bad_request_violation(field, rest.trim_start());
        }
    }
    Status::with_error_details(code, message, details)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tonic_types::ErrorDetails;

    use super::*;

    const ATTRS: &[&str] = &[
        "tenant",
        "gpu_type",
        "gpus",
        "burst_gpus",
        "node_count",
        "acceptance",
    ];

    /// A refusal as the backend sends it: its field (if any) and reason as details.
    fn refused(code: Code, message: &str, field: Option<&str>) -> Status {
        let mut details = ErrorDetails::with_error_info("REFUSED", "gpufleet", HashMap::new());
        if let Some(field) = field {
            details.add_bad_request_violation(field, "why");
        }
        Status::with_error_details(code, message, details)
    }

    #[test]
    fn a_refusal_is_said_on_the_attribute_its_details_name() {
        let s = refused(
            Code::FailedPrecondition,
            "node_count: needs 3 A100-80GB nodes",
            Some("node_count"),
        );
        let d = refusal(&s, ATTRS, "gpus").unwrap();
        assert_eq!(d.path, Some(AttrPath::attr("node_count")));
        assert_eq!(d.summary, "node_count: needs 3 A100-80GB nodes");
        let s = refused(
            Code::InvalidArgument,
            "burst_gpus: must be at least 0",
            Some("burst_gpus"),
        );
        let d = refusal(&s, ATTRS, "gpus").unwrap();
        assert_eq!(d.path, Some(AttrPath::attr("burst_gpus")));
        assert_eq!(d.summary, "burst_gpus: must be at least 0");
        let s = refused(Code::AlreadyExists, "gpu_type: taken", Some("gpu_type"));
        assert_eq!(
            refusal(&s, ATTRS, "gpus").unwrap().path,
            Some(AttrPath::attr("gpu_type"))
        );
    }

    #[test]
    fn the_details_decide_not_the_wording() {
        // Reworded: the message no longer starts with the field; the details still say it.
        let s = refused(
            Code::FailedPrecondition,
            "only 2 A100-80GB nodes are free; 3 were asked for",
            Some("node_count"),
        );
        let d = refusal(&s, ATTRS, "gpus").unwrap();
        assert_eq!(d.path, Some(AttrPath::attr("node_count")));
        assert_eq!(
            d.summary,
            "node_count: only 2 A100-80GB nodes are free; 3 were asked for"
        );
        // A message that starts with an attribute's name but whose details name none.
        let s = refused(
            Code::FailedPrecondition,
            "burst_gpus: must be at least 0",
            None,
        );
        let d = refusal(&s, ATTRS, "gpus").unwrap();
        assert_eq!(d.path, Some(AttrPath::attr("gpus")));
        assert_eq!(d.summary, "gpus: burst_gpus: must be at least 0");
    }

    #[test]
    fn wire_names_become_attribute_names() {
        let s = refused(
            Code::InvalidArgument,
            "tenant_id: required",
            Some("tenant_id"),
        );
        let d = refusal(&s, ATTRS, "gpus").unwrap();
        assert_eq!(d.path, Some(AttrPath::attr("tenant")));
        assert_eq!(d.summary, "tenant: required");
    }

    #[test]
    fn dotted_fields_are_nested_attributes() {
        let message = "acceptance.min_bus_bandwidth_gbps: must be between 0 and 100000 Gbit/s";
        let s = refused(
            Code::InvalidArgument,
            message,
            Some("acceptance.min_bus_bandwidth_gbps"),
        );
        let d = refusal(&s, ATTRS, "node_count").unwrap();
        assert_eq!(
            d.path,
            Some(AttrPath::attr("acceptance").child("min_bus_bandwidth_gbps"))
        );
        assert_eq!(d.summary, message);
        // A block the resource does not have: the default attribute.
        let s = refused(
            Code::InvalidArgument,
            "inventory.gpus: empty",
            Some("inventory.gpus"),
        );
        let d = refusal(&s, ATTRS, "node_count").unwrap();
        assert_eq!(d.path, Some(AttrPath::attr("node_count")));
        assert_eq!(d.summary, "node_count: inventory.gpus: empty");
    }

    #[test]
    fn other_refusals_are_said_on_the_default_attribute() {
        let message = "needs 24 H100-80GB GPUs, quota leaves 16";
        for s in [
            refused(Code::FailedPrecondition, message, None),
            Status::failed_precondition(message),
            // A field the resource does not have.
            refused(Code::FailedPrecondition, message, Some("storage_class")),
        ] {
            let d = refusal(&s, ATTRS, "node_count").unwrap();
            assert_eq!(d.path, Some(AttrPath::attr("node_count")));
            assert_eq!(
                d.summary,
                "node_count: needs 24 H100-80GB GPUs, quota leaves 16"
            );
        }
        assert!(refusal(&Status::internal("disk full"), ATTRS, "gpus").is_none());
        assert!(refusal(&Status::unauthenticated("no"), ATTRS, "gpus").is_none());
        let s = refused(Code::NotFound, "gpus: gone", Some("gpus"));
        assert!(refusal(&s, ATTRS, "gpus").is_none());
    }

    #[test]
    fn a_missing_quota_may_come_with_the_same_apply() {
        let s = Status::failed_precondition(
            "needs 8 A100-80GB GPUs, tenant 'team' has no quota for A100-80GB (create a gpu quota first)",
        );
        assert!(no_quota_yet(&s));
        assert!(!no_quota_yet(&Status::failed_precondition(
            "needs 24 H100-80GB GPUs, quota of tenant 'team' leaves 16"
        )));
    }
}
