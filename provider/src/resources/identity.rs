//! Every managed resource's identity (Terraform 1.12+), in one table: the tenant's name
//! and the object's name where objects have names, else the id that names it.
//!
//! | resource | identity | import id it stands for |
//! |---|---|---|
//! | `tenant` | `name` | `NAME` |
//! | `tenant_token` | `tenant`, `name` | `TENANT/NAME` (`NAME` for the token's own tenant, or an admin-scoped token) |
//! | `gpu_quota` | `tenant`, `gpu_type` | `TENANT/GPU_TYPE` |
//! | `tenant_cluster` | `tenant`, `name` | `TENANT/NAME` |
//! | `reservation` | `id` | `ID` (reservations have no name) |
//! | `health_check` | `cluster_id` | `CLUSTER_ID` (one per cluster) |
//!
//! `tenant` is the tenant's name: states spell the tenant as their configuration does (an
//! id, a name, or nothing for a tenant token's own), so making an identity asks the
//! backend for the name, once per object (Terraform keeps the identity after that).

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;

use super::common::{answered, required_str};
use crate::framework::{
    AttrPath, Diagnostic, Diagnostics, IdentityAttribute, IdentitySchema, ResourceIdentity, Value,
};
use crate::state::ProviderState;

/// How an identity is made from a state and turned into an import id.
#[derive(Clone, Copy)]
enum Shape {
    /// One attribute of the state, which is also the import id.
    Attribute(&'static str),
    /// The tenant's name and one attribute of the object (`TENANT/VALUE`). The state holds
    /// the tenant in `tenant_from` (as written, or null for the token's own tenant).
    Tenanted {
        tenant_from: &'static str,
        name: &'static str,
    },
}

struct Identity {
    resource: &'static str,
    shape: Shape,
    provider: Arc<ProviderState>,
}

const TENANT_DOC: &str =
    "The tenant's name. Optional at import with a tenant token (its own tenant).";

pub fn all(provider: &Arc<ProviderState>) -> Vec<Arc<dyn ResourceIdentity>> {
    use Shape::*;
    let table = [
        ("tenant", Attribute("name")),
        (
            "tenant_token",
            Tenanted {
                tenant_from: "tenant_id",
                name: "name",
            },
        ),
        (
            "gpu_quota",
            Tenanted {
                tenant_from: "tenant",
                name: "gpu_type",
            },
        ),
        (
            "tenant_cluster",
            Tenanted {
                tenant_from: "tenant",
                name: "name",
            },
        ),
        ("reservation", Attribute("id")),
        ("health_check", Attribute("cluster_id")),
    ];
    table
        .into_iter()
        .map(|(resource, shape)| {
            Arc::new(Identity {
                resource,
                shape,
                provider: provider.clone(),
            }) as Arc<dyn ResourceIdentity>
        })
        .collect()
}

fn description(resource: &str, attribute: &str) -> &'static str {
    match (resource, attribute) {
        ("tenant", _) => "The tenant's name.",
        ("gpu_quota", _) => "The GPU model the quota is for, e.g. `H100-80GB`.",
        ("reservation", _) => "The reservation's id.",
        ("health_check", _) => "The id of the cluster whose checks it runs.",
        ("tenant_token", _) => "The token's name.",
        _ => "The cluster's name.",
    }
}

/// Where a resource's state names its tenant, and the resource as a person says it (a
/// health check's state records its cluster's tenant's id); None for a resource whose
/// state names none.
fn tenant_attribute(resource: &str) -> Option<(&'static str, &'static str)> {
    match resource {
        "tenant" => Some(("name", "tenant")),
        "tenant_token" => Some(("tenant_id", "token")),
        "gpu_quota" => Some(("tenant", "GPU quota")),
        "tenant_cluster" => Some(("tenant", "cluster")),
        "reservation" => Some(("tenant", "reservation")),
        "health_check" => Some(("tenant_id", "health check")),
        _ => None,
    }
}

/// The tenant's name, asked of the backend: `spelled` is an id or a name, or empty for the
/// token's own tenant.
async fn tenant_name(provider: &ProviderState, spelled: &str) -> Result<String, Diagnostics> {
    let client = provider.client()?;
    let request = api::GetTenantRequest {
        id: spelled.to_string(),
    };
    Ok(answered(&client, client.tenants().get_tenant(request).await)?.name)
}

fn given(identity: &Value, name: &str) -> Result<Option<String>, Diagnostics> {
    Ok(identity
        .str_attr(name)
        .map_err(Diagnostics::from)?
        .filter(|v| !v.is_empty())
        .map(str::to_string))
}

#[async_trait]
impl ResourceIdentity for Identity {
    fn resource(&self) -> &'static str {
        self.resource
    }

    fn schema(&self) -> IdentitySchema {
        let of = |name| description(self.resource, name);
        IdentitySchema::new(match self.shape {
            Shape::Attribute(name) => vec![IdentityAttribute::required(name, of(name))],
            Shape::Tenanted { name, .. } => vec![
                IdentityAttribute::optional("tenant", TENANT_DOC),
                IdentityAttribute::required(name, of(name)),
            ],
        })
    }

    async fn of(&self, state: &Value) -> Result<Value, Diagnostics> {
        match self.shape {
            Shape::Attribute(name) => Ok(Value::object([(name, state.get(name).clone())])),
            Shape::Tenanted { tenant_from, name } => {
                let spelled = state
                    .str_attr(tenant_from)
                    .map_err(Diagnostics::from)?
                    .unwrap_or_default()
                    .to_string();
                // An admin-scoped token has no tenant.
                let tenant = if self.resource == "tenant_token" && spelled.is_empty() {
                    Value::Null
                } else {
                    Value::String(tenant_name(&self.provider, &spelled).await?)
                };
                Ok(Value::object([
                    ("tenant", tenant),
                    (name, Value::String(required_str(state, name)?)),
                ]))
            }
        }
    }

    async fn refuse_unseen(
        &self,
        identity: Option<&Value>,
        prior: &Value,
    ) -> Result<(), Diagnostics> {
        let Some((attribute, kind)) = tenant_attribute(self.resource) else {
            return Ok(());
        };
        // The tenant the state names: its identity's name (1.12+), else as the state spells
        // it (a name or an id; nothing for a tenant token's own, which this cannot judge).
        let named = identity
            .and_then(|i| given(i, "tenant").ok().flatten())
            .filter(|_| self.resource != "tenant");
        let Some(theirs) = named.or_else(|| given(prior, attribute).ok().flatten()) else {
            return Ok(());
        };
        let client = self.provider.client()?;
        // The admin token sees every tenant's objects: what it cannot find is gone.
        let Some((own_id, own_name)) = client.own_tenant_named().await else {
            return Ok(());
        };
        if theirs == own_id || theirs == own_name {
            return Ok(());
        }
        Err(Diagnostic::error_at(
            AttrPath::attr(attribute),
            match self.resource {
                "tenant" => format!(
                    "{attribute}: this state's tenant is {theirs}; the token is {own_name}'s"
                ),
                _ => format!(
                    "{attribute}: this state's {kind} belongs to tenant {theirs}; the token is {own_name}'s"
                ),
            },
            format!("A tenant's token sees only its own tenant's objects, so the backend answers for this {kind} as for one that does not exist. It was not read as deleted, and nothing was planned: run with tenant {theirs}'s token, or the admin token."),
        )
        .into())
    }

    fn import_id(&self, identity: &Value) -> Result<String, Diagnostics> {
        let missing = |name: &str| {
            Diagnostics::from(Diagnostic::error_at(
                AttrPath::attr(name),
                format!("{name}: required in the identity of a {}", self.resource),
                "",
            ))
        };
        match self.shape {
            Shape::Attribute(name) => given(identity, name)?.ok_or_else(|| missing(name)),
            Shape::Tenanted { name, .. } => {
                let value = given(identity, name)?.ok_or_else(|| missing(name))?;
                Ok(match given(identity, "tenant")? {
                    Some(tenant) => format!("{tenant}/{value}"),
                    None => value,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(resource: &str) -> Arc<dyn ResourceIdentity> {
        all(&Arc::new(ProviderState::default()))
            .into_iter()
            .find(|i| i.resource() == resource)
            .unwrap()
    }

    #[test]
    fn every_resource_has_an_identity_naming_tenant_and_name_where_names_exist() {
        let names: Vec<&str> = all(&Arc::new(ProviderState::default()))
            .iter()
            .map(|i| i.resource())
            .collect();
        let state = Arc::new(ProviderState::default());
        let resources: Vec<&str> = super::super::all(&state).iter().map(|r| r.name()).collect();
        assert_eq!(names.len(), resources.len());
        for r in resources {
            assert!(names.contains(&r), "{r} has no identity");
        }
        let cluster = identity("tenant_cluster").schema();
        let attrs: Vec<&str> = cluster.attributes.iter().map(|a| a.name).collect();
        assert_eq!(attrs, ["tenant", "name"]);
    }

    #[test]
    fn an_identity_names_the_import_id_of_the_same_object() {
        let named = Value::object([
            ("tenant", Value::string("team-a")),
            ("name", Value::string("train")),
        ]);
        assert_eq!(
            identity("tenant_cluster").import_id(&named).unwrap(),
            "team-a/train"
        );
        let own = Value::object([("tenant", Value::Null), ("name", Value::string("ci"))]);
        assert_eq!(identity("tenant_token").import_id(&own).unwrap(), "ci");
        let quota = Value::object([("tenant", Value::Null), ("gpu_type", Value::Null)]);
        let err = identity("gpu_quota").import_id(&quota).unwrap_err();
        assert!(
            err.0[0].summary.starts_with("gpu_type: required"),
            "{err:?}"
        );
        let reservation = Value::object([("id", Value::string("r-1"))]);
        assert_eq!(
            identity("reservation").import_id(&reservation).unwrap(),
            "r-1"
        );
    }

    #[tokio::test]
    async fn identities_without_a_tenant_come_from_the_state_alone() {
        let state = Value::object([("id", Value::string("t1")), ("name", Value::string("ml"))]);
        let made = identity("tenant").of(&state).await.unwrap();
        assert_eq!(made, Value::object([("name", Value::string("ml"))]));
    }
}
