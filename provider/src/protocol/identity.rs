//! Resource identity over the wire (protocol 6.9, Terraform 1.12+): the identity schemas,
//! the identity answered beside each state, imports by identity and identity upgrades.
//!
//! An identity, once Terraform holds one, is answered back unchanged while the object
//! lives: it names the object for good. One is made (`ResourceIdentity::of`, which may
//! ask the backend) only when Terraform holds none: after a create or an import, or for a
//! state written before identities. Clients older than 1.12 never ask for the schemas and
//! keep no identity, so none is made for them (a read costs them no extra call).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::dynamic::{decode, encode};
use super::tfplugin6 as tf;
use super::values::{from_json, type_json};
use crate::framework::{
    Diagnostic, Diagnostics, IdentitySchema, ResourceIdentity, Severity, Type, Value,
};

struct Registered {
    inner: Arc<dyn ResourceIdentity>,
    schema: IdentitySchema,
    ty: Type,
}

/// The identities of the provider's resources, by full type name.
pub struct Identities {
    by_type: BTreeMap<String, Registered>,
    /// Set once the client asks for the identity schemas (Terraform 1.12+).
    asked: AtomicBool,
}

impl Identities {
    pub fn new(prefix: &str, identities: Vec<Arc<dyn ResourceIdentity>>) -> Self {
        let by_type = identities
            .into_iter()
            .map(|inner| {
                let schema = inner.schema();
                let ty = schema.object_type();
                let name = format!("{prefix}_{}", inner.resource());
                (name, Registered { inner, schema, ty })
            })
            .collect();
        Self {
            by_type,
            asked: AtomicBool::new(false),
        }
    }

    /// GetResourceIdentitySchemas' answer; from then on identities are made.
    pub fn schemas(&self) -> HashMap<String, tf::ResourceIdentitySchema> {
        self.asked.store(true, Ordering::Relaxed);
        self.by_type
            .iter()
            .map(|(name, r)| (name.clone(), schema(&r.schema)))
            .collect()
    }

    fn of_type(&self, type_name: &str) -> Option<&Registered> {
        if self.asked.load(Ordering::Relaxed) {
            self.by_type.get(type_name)
        } else {
            None
        }
    }

    /// The identity to answer beside `state`: the one Terraform holds (`held`), else a new
    /// one. None for a null state, a type without identity or a client without identities.
    /// A failure to make one is a warning: the object itself is fine, and the next read
    /// tries again.
    pub async fn kept_or_made(
        &self,
        type_name: &str,
        held: Option<&tf::ResourceIdentityData>,
        state: &Value,
        diagnostics: &mut Diagnostics,
    ) -> Option<tf::ResourceIdentityData> {
        let r = self.of_type(type_name)?;
        if state.is_null() || !state.is_fully_known() {
            return None;
        }
        if let Some(held) = held.filter(|h| is_set(h, &r.ty)) {
            return Some(held.clone());
        }
        match r.inner.of(state).await {
            Ok(identity) => Some(data(&identity, &r.ty)),
            Err(d) => {
                diagnostics.0.extend(d.0.into_iter().map(|mut d| {
                    d.severity = Severity::Warning;
                    d.summary = format!("{type_name}: no resource identity: {}", d.summary);
                    d
                }));
                None
            }
        }
    }

    /// After a read found nothing where `prior` was: the resource's word on whether the
    /// object is gone or only hidden from the token (`ResourceIdentity::refuse_unseen`),
    /// with the identity Terraform holds.
    pub async fn confirm_gone(
        &self,
        type_name: &str,
        held: Option<&tf::ResourceIdentityData>,
        prior: &Value,
    ) -> Result<(), Diagnostics> {
        let Some(r) = self.by_type.get(type_name) else {
            return Ok(());
        };
        let identity = match held.filter(|h| is_set(h, &r.ty)) {
            Some(h) => Some(decode(h.identity_data.as_ref(), &r.ty)?),
            None => None,
        };
        r.inner.refuse_unseen(identity.as_ref(), prior).await
    }

    /// `identity` on the wire, of `type_name`'s identity type: for a list's results, which
    /// only clients that know identities ask for.
    pub fn encoded(&self, type_name: &str, identity: &Value) -> Option<tf::ResourceIdentityData> {
        let r = self.by_type.get(type_name)?;
        Some(data(identity, &r.ty))
    }

    /// The import id that the identity of an `import { identity = {...} }` names.
    pub fn import_id(
        &self,
        type_name: &str,
        identity: &tf::ResourceIdentityData,
    ) -> Result<String, Diagnostics> {
        let r = self.by_type.get(type_name).ok_or_else(|| {
            Diagnostics::from(Diagnostic::error(
                format!("{type_name} has no resource identity"),
                "Import it by id instead.",
            ))
        })?;
        let value = decode(identity.identity_data.as_ref(), &r.ty)?;
        r.inner.import_id(&value)
    }

    /// Every identity schema is version 0: an upgrade re-reads the stored JSON.
    pub fn upgrade(
        &self,
        req: &tf::upgrade_resource_identity::Request,
    ) -> Result<tf::ResourceIdentityData, Diagnostics> {
        let r = self.by_type.get(&req.type_name).ok_or_else(|| {
            Diagnostics::from(Diagnostic::error(
                format!("{} has no resource identity", req.type_name),
                "",
            ))
        })?;
        if req.version > r.schema.version {
            return Err(Diagnostic::error(
                format!(
                    "{}: the identity was written by a newer provider (identity version {}, this one knows {})",
                    req.type_name, req.version, r.schema.version
                ),
                "Use a provider at least as new as the one that wrote the state.",
            )
            .into());
        }
        let json = req
            .raw_identity
            .as_ref()
            .map(|s| s.json.as_slice())
            .unwrap_or_default();
        let value = from_json(json, &r.ty).map_err(Diagnostics::from)?;
        Ok(data(&value, &r.ty))
    }
}

fn is_set(held: &tf::ResourceIdentityData, ty: &Type) -> bool {
    decode(held.identity_data.as_ref(), ty).is_ok_and(|v| !v.is_null())
}

fn data(identity: &Value, ty: &Type) -> tf::ResourceIdentityData {
    tf::ResourceIdentityData {
        identity_data: encode(identity, ty),
    }
}

fn schema(s: &IdentitySchema) -> tf::ResourceIdentitySchema {
    tf::ResourceIdentitySchema {
        version: s.version,
        identity_attributes: s
            .attributes
            .iter()
            .map(|a| tf::resource_identity_schema::IdentityAttribute {
                name: a.name.to_string(),
                r#type: type_json(&a.ty).to_string().into_bytes(),
                required_for_import: a.required_for_import,
                optional_for_import: !a.required_for_import,
                description: a.description.to_string(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use tonic::Request;

    use super::super::dynamic::{decode, encode};
    use super::super::fakes::service;
    use super::super::tfplugin6 as tf;
    use crate::framework::{Type, Value};
    use tf::provider_server::Provider;

    fn thing_ty() -> Type {
        Type::object([("name", Type::String), ("size", Type::Number)])
    }

    fn identity_ty() -> Type {
        Type::object([("name", Type::String)])
    }

    fn thing(name: &str) -> Option<tf::DynamicValue> {
        encode(
            &Value::object([("name", Value::string(name)), ("size", Value::Number(1))]),
            &thing_ty(),
        )
    }

    fn identity_named(name: &str) -> tf::ResourceIdentityData {
        tf::ResourceIdentityData {
            identity_data: encode(
                &Value::object([("name", Value::string(name))]),
                &identity_ty(),
            ),
        }
    }

    fn name_in(identity: &Option<tf::ResourceIdentityData>) -> Value {
        let data = identity.as_ref().expect("an identity");
        decode(data.identity_data.as_ref(), &identity_ty())
            .unwrap()
            .get("name")
            .clone()
    }

    async fn read(
        svc: &super::super::service::ProviderService,
        held: Option<tf::ResourceIdentityData>,
    ) -> tf::read_resource::Response {
        svc.read_resource(Request::new(tf::read_resource::Request {
            type_name: "test_thing".into(),
            current_state: thing("a"),
            current_identity: held,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner()
    }

    #[tokio::test]
    async fn a_client_that_never_asked_for_identity_schemas_gets_none_and_costs_nothing() {
        let (svc, calls) = service();
        let answer = read(&svc, None).await;
        assert!(answer.new_identity.is_none());
        assert_eq!(calls.made(), 0, "no identity made for an old client");
    }

    #[tokio::test]
    async fn an_identity_is_made_once_then_the_held_one_is_answered_unchanged() {
        let (svc, calls) = service();
        let schemas = svc
            .get_resource_identity_schemas(Request::new(Default::default()))
            .await
            .unwrap()
            .into_inner();
        let schema = &schemas.identity_schemas["test_thing"];
        assert!(schema.identity_attributes[0].required_for_import);

        let first = read(&svc, None).await;
        assert_eq!(name_in(&first.new_identity), Value::string("a"));
        assert_eq!(calls.made(), 1);
        let again = read(&svc, Some(identity_named("held"))).await;
        assert_eq!(name_in(&again.new_identity), Value::string("held"));
        assert_eq!(calls.made(), 1, "a held identity is not made again");

        let update = svc
            .plan_resource_change(Request::new(tf::plan_resource_change::Request {
                type_name: "test_thing".into(),
                prior_state: thing("a"),
                proposed_new_state: thing("a"),
                config: thing("a"),
                prior_identity: Some(identity_named("held")),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(name_in(&update.planned_identity), Value::string("held"));
        let create = svc
            .plan_resource_change(Request::new(tf::plan_resource_change::Request {
                type_name: "test_thing".into(),
                prior_state: encode(&Value::Null, &thing_ty()),
                proposed_new_state: thing("b"),
                config: thing("b"),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        assert!(
            create.planned_identity.is_none(),
            "a create has none until apply"
        );
        let created = svc
            .apply_resource_change(Request::new(tf::apply_resource_change::Request {
                type_name: "test_thing".into(),
                prior_state: encode(&Value::Null, &thing_ty()),
                planned_state: thing("b"),
                config: thing("b"),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(name_in(&created.new_identity), Value::string("b"));
    }

    #[tokio::test]
    async fn an_import_by_identity_imports_the_id_it_names_and_answers_its_identity() {
        let (svc, calls) = service();
        svc.get_resource_identity_schemas(Request::new(Default::default()))
            .await
            .unwrap();
        let answer = svc
            .import_resource_state(Request::new(tf::import_resource_state::Request {
                type_name: "test_thing".into(),
                id: String::new(),
                identity: Some(identity_named("by-name")),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        assert!(answer.diagnostics.is_empty(), "{:?}", answer.diagnostics);
        let imported = &answer.imported_resources[0];
        let state = decode(imported.state.as_ref(), &thing_ty()).unwrap();
        assert_eq!(state.get("name"), &Value::string("by-name"));
        assert_eq!(name_in(&imported.identity), Value::string("by-name"));
        assert_eq!(calls.made(), 1);
    }

    #[tokio::test]
    async fn a_stored_json_identity_upgrades_and_a_newer_version_is_refused() {
        let (svc, _calls) = service();
        let upgrade = |version| tf::upgrade_resource_identity::Request {
            type_name: "test_thing".into(),
            version,
            raw_identity: Some(tf::RawState {
                json: br#"{"name":"a"}"#.to_vec(),
                flatmap: Default::default(),
            }),
        };
        let ok = svc
            .upgrade_resource_identity(Request::new(upgrade(0)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(name_in(&ok.upgraded_identity), Value::string("a"));
        let newer = svc
            .upgrade_resource_identity(Request::new(upgrade(1)))
            .await
            .unwrap()
            .into_inner();
        assert!(newer.diagnostics[0].summary.contains("newer provider"));
    }
}
