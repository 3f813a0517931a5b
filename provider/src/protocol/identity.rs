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

use super::service::{decode, encode};
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
