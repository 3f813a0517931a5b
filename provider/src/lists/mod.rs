//! The list resources of `terraform query`: tenants, tenant clusters, reservations and GPU
//! quotas, as the caller's token sees them (the backend's List calls scope by token: a
//! tenant token finds its own tenant's objects, the admin token everything).
//!
//! Each result carries the identity that `resources::identity` gives the same object (the
//! tenant's name where names exist, a reservation's id), so `-generate-config-out`'s
//! `import { identity = ... }` blocks import what was found. A result's state, when
//! Terraform asks for it, is what importing that identity gives: the generated
//! configuration then plans as an import with no change.
//!
//! Nodes have no list resource: Terraform lists only managed resource types (a list's
//! results are imported as that type), and nodes are the fleet's, brought by their agents,
//! not managed by Terraform; the `gpufleet_nodes` data source reads them.

mod fetch;

use std::sync::Arc;

use async_trait::async_trait;

use crate::framework::{
    Attribute, Diagnostics, ListResourceType, Listed, ResourceIdentity, ResourceType, Schema, Type,
    Value,
};
use crate::state::ProviderState;
use fetch::Kind;

pub fn all(state: &Arc<ProviderState>) -> Vec<Arc<dyn ListResourceType>> {
    let resources = crate::resources::all(state);
    let identities = crate::resources::identity::all(state);
    [
        Kind::Tenants,
        Kind::Clusters,
        Kind::Reservations,
        Kind::Quotas,
    ]
    .into_iter()
    .filter_map(|kind| {
        let resource = resources.iter().find(|r| r.name() == kind.resource())?;
        let identity = identities
            .iter()
            .find(|i| i.resource() == kind.resource())?;
        Some(Arc::new(List {
            kind,
            provider: state.clone(),
            resource: resource.clone(),
            identity: identity.clone(),
        }) as Arc<dyn ListResourceType>)
    })
    .collect()
}

struct List {
    kind: Kind,
    provider: Arc<ProviderState>,
    /// The managed resource whose import gives each result's state.
    resource: Arc<dyn ResourceType>,
    identity: Arc<dyn ResourceIdentity>,
}

const TENANT_FILTER: &str = "Only this tenant's (its name or id). A tenant token finds only its own tenant's whatever this says.";

#[async_trait]
impl ListResourceType for List {
    fn name(&self) -> &'static str {
        self.kind.resource()
    }

    fn schema(&self) -> Schema {
        let description = self.kind.description();
        let attributes = match self.kind {
            Kind::Tenants => Vec::new(),
            _ => vec![Attribute::optional("tenant", Type::String, TENANT_FILTER)],
        };
        Schema::new(description, attributes)
    }

    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let mut diags = Diagnostics::default();
        if let Ok(Some("")) = config.str_attr("tenant") {
            diags.attr_error(
                "tenant",
                "must not be empty (leave it out to find every tenant's the token may see)",
            );
        }
        diags.into_result()
    }

    async fn list(
        &self,
        config: &Value,
        include_state: bool,
        limit: usize,
    ) -> Result<Vec<Listed>, Diagnostics> {
        let client = self.provider.client()?;
        let tenant = match self.kind {
            Kind::Tenants => "",
            _ => config
                .str_attr("tenant")
                .map_err(Diagnostics::from)?
                .unwrap_or_default(),
        };
        let found = fetch::found(&client, self.kind, tenant, limit).await?;
        let mut listed = Vec::with_capacity(found.len());
        for (identity, display_name) in found {
            // One Get per result, only when asked; bounded by the limit.
            let state = if include_state {
                let id = self.identity.import_id(&identity)?;
                Some(self.resource.import(&id).await?)
            } else {
                None
            };
            listed.push(Listed {
                identity,
                display_name,
                state,
            });
        }
        Ok(listed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(resource: &str) -> Arc<dyn ListResourceType> {
        all(&Arc::new(ProviderState::default()))
            .into_iter()
            .find(|l| l.name() == resource)
            .unwrap()
    }

    #[test]
    fn tenants_quotas_clusters_and_reservations_are_listed_by_their_resource_type() {
        let names: Vec<&str> = all(&Arc::new(ProviderState::default()))
            .iter()
            .map(|l| l.name())
            .collect();
        assert_eq!(
            names,
            ["tenant", "tenant_cluster", "reservation", "gpu_quota"]
        );
        assert!(list("tenant").schema().attributes.is_empty());
        assert_eq!(list("gpu_quota").schema().attributes[0].name, "tenant");
    }

    #[tokio::test]
    async fn an_empty_tenant_filter_is_refused_on_its_attribute() {
        let config = Value::object([("tenant", Value::string(""))]);
        let err = list("tenant_cluster").validate(&config).await.unwrap_err();
        assert!(
            err.0[0].summary.starts_with("tenant: must not be empty"),
            "{err:?}"
        );
        let unknown = Value::object([("tenant", Value::Unknown)]);
        assert!(list("reservation").validate(&unknown).await.is_ok());
    }
}
