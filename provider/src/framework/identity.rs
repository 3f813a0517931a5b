//! Resource identity (Terraform 1.12+): the few attributes that name a managed object for
//! good (e.g. its tenant and name), kept by Terraform beside the state and written in
//! `import { identity = {...} }`. Free of any protocol library.

use async_trait::async_trait;

use super::diagnostics::Diagnostics;
use super::schema::Type;
use super::value::Value;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityAttribute {
    pub name: &'static str,
    pub ty: Type,
    /// An import by identity must give it; otherwise it is optional there (e.g. a tenant
    /// token's own tenant).
    pub required_for_import: bool,
    /// Markdown.
    pub description: &'static str,
}

impl IdentityAttribute {
    pub fn required(name: &'static str, description: &'static str) -> Self {
        Self {
            name,
            ty: Type::String,
            required_for_import: true,
            description,
        }
    }

    pub fn optional(name: &'static str, description: &'static str) -> Self {
        Self {
            required_for_import: false,
            ..Self::required(name, description)
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentitySchema {
    /// Separate from the resource schema's version; raised when the attributes change.
    pub version: i64,
    pub attributes: Vec<IdentityAttribute>,
}

impl IdentitySchema {
    pub fn new(attributes: Vec<IdentityAttribute>) -> Self {
        Self {
            version: 0,
            attributes,
        }
    }

    pub fn object_type(&self) -> Type {
        Type::Object(
            self.attributes
                .iter()
                .map(|a| (a.name.to_string(), a.ty.clone()))
                .collect(),
        )
    }
}

/// The identity of one managed resource type.
#[async_trait]
pub trait ResourceIdentity: Send + Sync {
    /// The resource type it identifies, without the provider prefix.
    fn resource(&self) -> &'static str;

    fn schema(&self) -> IdentitySchema;

    /// The identity of the object that `state` describes; may ask the backend (e.g. for
    /// a tenant's name when the state holds its id). Called only when Terraform holds no
    /// identity for the object yet: after a create, an import, or a state from before.
    async fn of(&self, state: &Value) -> Result<Value, Diagnostics>;

    /// The import id (what `terraform import` takes) of the object `identity` names.
    fn import_id(&self, identity: &Value) -> Result<String, Diagnostics>;

    /// Called when a read finds nothing: an error when the object is not gone but out of
    /// the token's sight (another tenant's), so that Terraform neither drops it from state
    /// nor plans a copy. `identity` is the one Terraform holds (1.12+), if any.
    async fn refuse_unseen(
        &self,
        identity: Option<&Value>,
        prior: &Value,
    ) -> Result<(), Diagnostics> {
        let _ = (identity, prior);
        Ok(())
    }
}
