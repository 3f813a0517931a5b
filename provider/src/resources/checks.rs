//! Plan-time admission without rules of the provider's own: a resource sends the create or
//! update it would send at apply with `validate_only`, the backend runs its one admission
//! path (tenant, model, quota, capacity, reservation, MIG layout, driver) and changes
//! nothing, and a refusal becomes a diagnostic on the attribute its message names.

use tonic::{Code, Response, Status};

use super::common::tenant_not_found;
use crate::client::Client;
use crate::framework::{AttrPath, Diagnostic, Diagnostics};

/// Wire fields that a resource spells differently.
const RENAMED: &[(&str, &str)] = &[("tenant_id", "tenant")];

/// What a dry run's answer means for the plan: admitted, or skipped because the tenant
/// does not exist yet (the same apply may create it; the real call then decides), or
/// refused with the backend's words on the attribute they are about. `attributes` are
/// the resource's attributes a message may start with; a refusal naming none is said on
/// `default`.
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

/// The backend's refusal of a request (its message starts with the field it is about,
/// e.g. `node_count: needs 3 A100-80GB nodes ...`), said on that attribute; None for what
/// is not a refusal of the request's values (transport, authentication, internal errors).
pub(crate) fn refusal(status: &Status, attributes: &[&str], default: &str) -> Option<Diagnostic> {
    let refused = matches!(
        status.code(),
        Code::InvalidArgument | Code::FailedPrecondition | Code::AlreadyExists | Code::OutOfRange
    );
    if !refused {
        return None;
    }
    let message = status.message();
    let named = |field: &str| {
        message
            .strip_prefix(field)
            .is_some_and(|rest| rest.starts_with(':') || rest.starts_with(' '))
    };
    let renamed = RENAMED
        .iter()
        .find(|(wire, attr)| attributes.contains(attr) && named(wire));
    if let Some((wire, attr)) = renamed {
        let text = format!("{attr}{}", &message[wire.len()..]);
        return Some(Diagnostic::error_at(AttrPath::attr(attr), text, ""));
    }
    // The longest name that matches: `burst_gpus: ...` is about burst_gpus, not gpus.
    let field = attributes
        .iter()
        .copied()
        .filter(|f| named(f))
        .max_by_key(|f| f.len());
    Some(match field {
        Some(field) => Diagnostic::error_at(AttrPath::attr(field), message, ""),
        None => Diagnostic::error_at(AttrPath::attr(default), format!("{default}: {message}"), ""),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ATTRS: &[&str] = &["tenant", "gpu_type", "gpus", "burst_gpus", "node_count"];

    #[test]
    fn a_message_naming_an_attribute_is_said_on_it() {
        let s = Status::failed_precondition("node_count: needs 3 A100-80GB nodes");
        let d = refusal(&s, ATTRS, "gpus").unwrap();
        assert_eq!(d.path, Some(AttrPath::attr("node_count")));
        assert_eq!(d.summary, "node_count: needs 3 A100-80GB nodes");
        let s = Status::failed_precondition("gpus + burst_gpus = 4 is below 8");
        assert_eq!(
            refusal(&s, ATTRS, "node_count").unwrap().path,
            Some(AttrPath::attr("gpus"))
        );
        let s = Status::invalid_argument("burst_gpus: must be at least 0");
        assert_eq!(
            refusal(&s, ATTRS, "gpus").unwrap().path,
            Some(AttrPath::attr("burst_gpus"))
        );
    }

    #[test]
    fn wire_names_become_attribute_names() {
        let s = Status::invalid_argument("tenant_id: required");
        let d = refusal(&s, ATTRS, "gpus").unwrap();
        assert_eq!(d.path, Some(AttrPath::attr("tenant")));
        assert_eq!(d.summary, "tenant: required");
    }

    #[test]
    fn other_refusals_are_said_on_the_default_attribute() {
        let s = Status::failed_precondition("needs 24 H100-80GB GPUs, quota leaves 16");
        let d = refusal(&s, ATTRS, "node_count").unwrap();
        assert_eq!(d.path, Some(AttrPath::attr("node_count")));
        assert_eq!(
            d.summary,
            "node_count: needs 24 H100-80GB GPUs, quota leaves 16"
        );
        assert!(refusal(&Status::internal("disk full"), ATTRS, "gpus").is_none());
        assert!(refusal(&Status::unauthenticated("no"), ATTRS, "gpus").is_none());
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
