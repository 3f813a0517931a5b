//! Plan-time admission without rules of the provider's own: a resource sends the create or
//! update it would send at apply with `validate_only`, the backend runs its one admission
//! path (tenant, model, quota, capacity, reservation, MIG layout, driver) and changes
//! nothing, and a refusal becomes a diagnostic on the attribute its details name (the
//! field of its `google.rpc.BadRequest`), whatever its wording.

use tonic::{Code, Response, Status};
use tonic_types::StatusExt;

use gpufleet_proto::error_info::{EXISTING_FIELD, EXISTING_ID};

use super::common::tenant_not_found;
use crate::client::Client;
use crate::framework::{AttrPath, Diagnostic, Diagnostics, Mode, Schema};
use crate::this_run::ThisRun;

/// Wire fields that a resource spells differently.
const RENAMED: &[(&str, &str)] = &[("tenant_id", "tenant")];

/// What a dry run asked about, for the answers that depend on this run's other resources.
pub(crate) struct Asked<'a> {
    /// The tenant as the plan spells it ("" for the token's own).
    pub tenant: &'a str,
    /// The GPU model whose quota the request draws on, if any.
    pub gpu_type: Option<&'a str>,
}

/// What a dry run's answer means for the plan: admitted, or refused with the backend's
/// words on the attributes they are about. What this run creates first is no refusal: a
/// tenant not found that this run plans to create, a missing quota this run plans to
/// create, a name held by an object this run has in state (the create half of its
/// replacement). `attributes` are the resource's attributes a refusal's field may be (or,
/// for a dotted field, start with); a refusal naming none is said on `default`.
pub(crate) async fn verdict<T>(
    client: &Client,
    run: &ThisRun,
    asked: Asked<'_>,
    answer: Result<Response<T>, Status>,
    attributes: &[&str],
    default: &str,
) -> Result<(), Diagnostics> {
    let status = match answer {
        Ok(_) => return Ok(()),
        Err(s) => s,
    };
    if tenant_not_found(&status) {
        if run.tenant_created(asked.tenant) {
            return Ok(());
        }
        return Err(unknown_tenant(&status).into());
    }
    if no_quota_yet(&status) {
        if let Some(gpu_type) = asked.gpu_type {
            if quota_created(client, run, asked.tenant, gpu_type).await {
                return Ok(());
            }
        }
    }
    match refusals(&status, attributes, default, |id| run.holds(id)) {
        Some(found) if found.is_empty() => Ok(()),
        Some(found) => Err(Diagnostics(found)),
        None => Err(client.diagnostic(&status).into()),
    }
}

/// A create refused because another object already has its `field` (ALREADY_EXISTS): the
/// diagnostic on `field` says how to adopt that object instead, by its `import_id`.
pub(crate) fn adopt_hint(
    diags: &mut Diagnostics,
    field: &str,
    resource_type: &str,
    import_id: &str,
) {
    // The command on a line of its own: Terraform wraps a detail's lines, not within words.
    let hint = format!(
        "It exists already. To manage it from this configuration, import it into this \
         resource (NAME: its name, after \"with\" above):\n  \
         terraform import {resource_type}.NAME {import_id}\n\
         or change this one's {field}."
    );
    let path = AttrPath::attr(field);
    for d in diags
        .0
        .iter_mut()
        .filter(|d| d.path.as_ref() == Some(&path))
    {
        d.detail = hint.clone();
    }
}

/// The tenant part of an import id (`TENANT/...`): as written, else the token's own by name.
pub(crate) async fn import_tenant(client: &Client, tenant: &str) -> String {
    match tenant {
        "" => client
            .own_tenant_named()
            .await
            .map_or_else(|| "TENANT".to_string(), |(_, name)| name),
        written => written.to_string(),
    }
}

/// The ids of the objects a delete was refused for, from its `ErrorInfo` (`used_by`):
/// the clusters and reservations that use a quota, the quotas, reservations and clusters
/// a tenant still has. None for any other refusal.
pub(crate) fn used_by(status: &Status) -> Vec<String> {
    ids_in(status, gpufleet_proto::error_info::USED_BY)
}

/// The ids a refusal's `ErrorInfo` metadata lists under `key`, comma-separated.
pub(crate) fn ids_in(status: &Status, key: &str) -> Vec<String> {
    status
        .get_details_error_info()
        .and_then(|i| i.metadata.get(key).cloned())
        .map(|ids| {
            ids.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// A tenant the backend does not know (or this token may not see), said on `tenant`.
pub(crate) fn unknown_tenant(status: &Status) -> Diagnostic {
    Diagnostic::error_at(
        AttrPath::attr("tenant"),
        format!("tenant: {}", status.message()),
        "If this apply creates that tenant, refer to it (e.g. `tenant = gpufleet_tenant.NAME.name`) so that Terraform plans and creates it first; a literal name gives Terraform no order.",
    )
}

/// Whether this run plans to create a quota of `gpu_type` for the tenant spelled `tenant`
/// (spelled the same, or another spelling of the same tenant).
async fn quota_created(client: &Client, run: &ThisRun, tenant: &str, gpu_type: &str) -> bool {
    let planned = run.quota_tenants(gpu_type);
    if planned.iter().any(|t| t == tenant) {
        return true;
    }
    let Some(id) = tenant_id(client, tenant).await else {
        return false;
    };
    for other in planned {
        if tenant_id(client, &other).await.as_deref() == Some(id.as_str()) {
            return true;
        }
    }
    false
}

/// The id of the tenant spelled `spelling`, when this token may see it.
async fn tenant_id(client: &Client, spelling: &str) -> Option<String> {
    let request = gpufleet_proto::v1::GetTenantRequest {
        id: spelling.to_string(),
    };
    client
        .tenants()
        .get_tenant(request)
        .await
        .ok()
        .map(|t| t.into_inner().id)
}

/// Whether a refusal says the tenant has no quota for the model at all: the same apply may
/// create that quota with numbers known only at apply (a quota whose numbers the plan
/// knows is sent with the dry run, and counted, instead).
fn no_quota_yet(status: &Status) -> bool {
    status.code() == Code::FailedPrecondition && status.message().contains(" has no quota for ")
}

/// Every refusal a status carries (one per field violation of its details), each on the
/// attribute it is about (see [`refusal`]); a taken name whose holder `held` says this run
/// has in state is left out. None for what is not a refusal of the request's values.
pub(crate) fn refusals(
    status: &Status,
    attributes: &[&str],
    default: &str,
    held: impl Fn(&str) -> bool,
) -> Option<Vec<Diagnostic>> {
    let first = refusal(status, attributes, default)?;
    let metadata = status
        .get_details_error_info()
        .map(|i| i.metadata)
        .unwrap_or_default();
    let freed = metadata
        .get(EXISTING_ID)
        .filter(|id| held(id))
        .and_then(|_| metadata.get(EXISTING_FIELD));
    let violations = status
        .get_details_bad_request()
        .map(|b| b.field_violations)
        .unwrap_or_default();
    if violations.len() <= 1 {
        let freed_one = violations.first().is_some_and(|v| Some(&v.field) == freed);
        return Some(if freed_one { vec![] } else { vec![first] });
    }
    Some(
        violations
            .into_iter()
            .filter(|v| Some(&v.field) != freed)
            .map(|v| {
                let path =
                    attribute_of(&v.field, attributes).unwrap_or_else(|| AttrPath::attr(default));
                Diagnostic::error_at(path.clone(), format!("{path}: {}", v.description), "")
            })
            .collect(),
    )
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

/// The attribute a wire field path is (AIP-193's form: `acceptance.level`,
/// `ssh_public_keys[2]`): its first name renamed where the resource spells it
/// differently, the rest nested below it; None when the first name is not one of
/// `attributes` or the path is malformed.
fn attribute_of(field: &str, attributes: &[&str]) -> Option<AttrPath> {
    let mut path: Option<AttrPath> = None;
    for segment in field.split('.') {
        let mut parts = segment.split('[');
        let name = parts.next().filter(|n| !n.is_empty())?;
        path = Some(match path {
            None => {
                let name = RENAMED
                    .iter()
                    .find(|(wire, _)| *wire == name)
                    .map_or(name, |(_, attr)| attr);
                if !attributes.contains(&name) {
                    return None;
                }
                AttrPath::attr(name)
            }
            Some(path) => path.child(name),
        });
        for index in parts {
            let index: usize = index.strip_suffix(']')?.parse().ok()?;
            path = path.map(|p| p.index(index));
        }
    }
    path
}

/// What a refusal of a resource's values may name: the attributes and blocks its
/// configuration writes (all of them, from the schema, so a new attribute is never
/// missing from a hand-kept list and its refusals never land on another attribute).
pub(crate) fn written(schema: &Schema) -> Vec<&'static str> {
    schema
        .attributes
        .iter()
        .filter(|a| a.mode != Mode::Computed)
        .map(|a| a.name)
        .chain(schema.blocks.iter().map(|b| b.name))
        .collect()
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
        let segment = |s: &str| {
            let mut parts = s.split('[');
            parts.next().is_some_and(path)
                && parts.all(|i| {
                    i.strip_suffix(']')
                        .is_some_and(|n| n.parse::<usize>().is_ok())
                })
        };
        if field.split('.').all(segment) {
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
    fn list_indexes_are_elements_of_the_attribute() {
        let attrs = &["ssh_public_keys", "node_count"];
        let message = "ssh_public_keys[1]: not an OpenSSH public key";
        let s = refused(Code::InvalidArgument, message, Some("ssh_public_keys[1]"));
        let d = refusal(&s, attrs, "node_count").unwrap();
        assert_eq!(d.path, Some(AttrPath::attr("ssh_public_keys").index(1)));
        assert_eq!(d.summary, message);
        for malformed in ["ssh_public_keys[x]", "ssh_public_keys[1", "[1]", "a..b"] {
            assert_eq!(attribute_of(malformed, attrs), None, "{malformed}");
        }
        assert_eq!(
            attribute_of("acceptance.nodes[2].level", &["acceptance"]),
            Some(
                AttrPath::attr("acceptance")
                    .child("nodes")
                    .index(2)
                    .child("level")
            )
        );
    }

    #[test]
    fn every_written_attribute_and_block_may_be_refused_and_no_computed_one() {
        use crate::framework::{Attribute, Block, Type};
        let schema = Schema::new(
            "",
            vec![
                Attribute::computed("id", Type::String, ""),
                Attribute::required("name", Type::String, ""),
                Attribute::optional_computed("ssh_public_keys", Type::list(Type::String), ""),
            ],
        )
        .with_block(Block {
            name: "acceptance",
            description: "",
            attributes: vec![],
        });
        assert_eq!(written(&schema), ["name", "ssh_public_keys", "acceptance"]);
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
    fn every_violation_is_said_and_a_name_this_run_frees_is_not() {
        let metadata = HashMap::from([
            (EXISTING_ID.to_string(), "c-1".to_string()),
            (EXISTING_FIELD.to_string(), "name".to_string()),
        ]);
        let mut details =
            ErrorDetails::with_error_info("FAILED_PRECONDITION", "gpufleet", metadata);
        details.add_bad_request_violation("node_count", "needs 24 GPUs, quota leaves 8");
        details.add_bad_request_violation("name", "tenant 'v' already has a cluster named 'cv'");
        let s = Status::with_error_details(Code::FailedPrecondition, "both", details);
        let attrs = &["name", "node_count"];
        let all = refusals(&s, attrs, "node_count", |_| false).unwrap();
        let summaries: Vec<&str> = all.iter().map(|d| d.summary.as_str()).collect();
        assert_eq!(
            summaries,
            [
                "node_count: needs 24 GPUs, quota leaves 8",
                "name: tenant 'v' already has a cluster named 'cv'"
            ]
        );
        assert_eq!(all[1].path, Some(AttrPath::attr("name")));
        // The cluster holding the name is this run's (its replacement is planned).
        let left = refusals(&s, attrs, "node_count", |id| id == "c-1").unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].path, Some(AttrPath::attr("node_count")));
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
