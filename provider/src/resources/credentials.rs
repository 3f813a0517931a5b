//! The credentials that resources kept in state before ephemeral resources existed:
//! `gpufleet_tenant.token`, `gpufleet_tenant_token.token` and
//! `gpufleet_tenant_cluster.credentials`. Each is deprecated (Terraform 1.15 warns where a
//! configuration refers to one), with a description that names its replacement; and unless
//! the provider says `store_credentials_in_state = true` none is written to state or plan:
//! `Withheld` answers them null.
//!
//! The wrapper sits around the resource, so each resource's own plan and apply logic is
//! unchanged: with the setting off, a state keeps what it holds until the next refresh
//! (`terraform apply -refresh-only` empties it).

use std::sync::Arc;

use async_trait::async_trait;

use crate::framework::{Diagnostics, PlannedChange, ResourceType, Schema, Value};
use crate::state::ProviderState;

/// A credential attribute and the description it carries once deprecated.
pub struct Credential {
    pub attribute: &'static str,
    pub description: &'static str,
}

pub const TENANT: &[Credential] = &[Credential {
    attribute: "token",
    description: "**Deprecated**: the tenant's bearer token (its token named `default`, scope `write`), issued at create and at each rotation (the backend stores only its hash), and kept in state only with the provider's `store_credentials_in_state = true` (even then null after import); otherwise null. Use `ephemeral \"gpufleet_tenant_token\"` (with the admin token) for a token that no state keeps; see the credentials guide.",
}];

pub const TENANT_TOKEN: &[Credential] = &[Credential {
    attribute: "token",
    description: "**Deprecated**: the secret, issued at create and at each rotation (the backend stores only its hash), and kept in state only with the provider's `store_credentials_in_state = true` (even then null after import); otherwise null. Use `ephemeral \"gpufleet_tenant_token\"` for a token minted for one run and revoked after it; see the credentials guide.",
}];

pub const TENANT_CLUSTER: &[Credential] = &[Credential {
    attribute: "credentials",
    description: "**Deprecated**: for this cluster alone, a kubeconfig (Kubernetes: the cluster's own CA and a client certificate and key signed by it), or for Slurm a JSON object saying how to log in: `user`, `host`, `port`, `login` (the ssh command), `known_hosts` (the line that checks the login's host key), `home` and `cluster` (Slurm's ClusterName). It holds no key of the platform. Kept in state only with the provider's `store_credentials_in_state = true`; otherwise null. Use `ephemeral \"gpufleet_cluster_credentials\"` instead; see the credentials guide.",
}];

/// A resource whose credential attributes are deprecated, and null in every state and
/// plan when the provider is configured not to keep them.
pub struct Withheld {
    inner: Arc<dyn ResourceType>,
    credentials: &'static [Credential],
    provider: Arc<ProviderState>,
}

impl Withheld {
    pub fn new(
        inner: Arc<dyn ResourceType>,
        credentials: &'static [Credential],
        provider: Arc<ProviderState>,
    ) -> Self {
        Self {
            inner,
            credentials,
            provider,
        }
    }

    fn withheld(&self, mut value: Value) -> Value {
        if self.provider.keeps_credentials() || value.is_null() || value.is_unknown() {
            return value;
        }
        for c in self.credentials {
            value.set(c.attribute, Value::Null);
        }
        value
    }
}

/// `schema` with the credential attributes deprecated.
pub fn deprecated(mut schema: Schema, credentials: &[Credential]) -> Schema {
    for a in &mut schema.attributes {
        if let Some(c) = credentials.iter().find(|c| c.attribute == a.name) {
            a.deprecated = true;
            a.description = c.description;
        }
    }
    schema
}

#[async_trait]
impl ResourceType for Withheld {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn schema(&self) -> Schema {
        deprecated(self.inner.schema(), self.credentials)
    }

    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        self.inner.validate(config).await
    }

    async fn read(&self, state: &Value) -> Result<Option<Value>, Diagnostics> {
        Ok(self.inner.read(state).await?.map(|v| self.withheld(v)))
    }

    async fn plan(
        &self,
        prior: Option<&Value>,
        proposed: Value,
        config: &Value,
    ) -> Result<PlannedChange, Diagnostics> {
        let mut planned = self.inner.plan(prior, proposed, config).await?;
        planned.state = self.withheld(planned.state);
        Ok(planned)
    }

    async fn create(&self, planned: &Value, config: &Value) -> Result<Value, Diagnostics> {
        Ok(self.withheld(self.inner.create(planned, config).await?))
    }

    async fn update(
        &self,
        prior: &Value,
        planned: &Value,
        config: &Value,
    ) -> Result<Value, Diagnostics> {
        Ok(self.withheld(self.inner.update(prior, planned, config).await?))
    }

    async fn delete(&self, prior: &Value) -> Result<(), Diagnostics> {
        self.inner.delete(prior).await
    }

    async fn plan_delete(&self, prior: &Value) -> Result<(), Diagnostics> {
        self.inner.plan_delete(prior).await
    }

    async fn import(&self, id: &str) -> Result<Value, Diagnostics> {
        Ok(self.withheld(self.inner.import(id).await?))
    }

    fn plan_warnings(&self, prior: &Value, planned: &Value) -> Diagnostics {
        self.inner.plan_warnings(prior, planned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::{Attribute, Type};

    struct Keeper;

    #[async_trait]
    impl ResourceType for Keeper {
        fn name(&self) -> &'static str {
            "keeper"
        }
        fn schema(&self) -> Schema {
            Schema::new(
                "k",
                vec![
                    Attribute::required("name", Type::String, "n"),
                    Attribute::computed("token", Type::String, "old").sensitive(),
                ],
            )
        }
        async fn read(&self, state: &Value) -> Result<Option<Value>, Diagnostics> {
            Ok(Some(state.clone()))
        }
        async fn plan(
            &self,
            _prior: Option<&Value>,
            mut proposed: Value,
            _config: &Value,
        ) -> Result<PlannedChange, Diagnostics> {
            proposed.set("token", Value::Unknown);
            Ok(PlannedChange {
                state: proposed,
                requires_replace: Vec::new(),
            })
        }
        async fn create(&self, planned: &Value, _config: &Value) -> Result<Value, Diagnostics> {
            let mut s = planned.clone();
            s.set("token", Value::string("gft_secret"));
            Ok(s)
        }
        async fn update(
            &self,
            _p: &Value,
            planned: &Value,
            c: &Value,
        ) -> Result<Value, Diagnostics> {
            self.create(planned, c).await
        }
        async fn delete(&self, _prior: &Value) -> Result<(), Diagnostics> {
            Ok(())
        }
        async fn import(&self, _id: &str) -> Result<Value, Diagnostics> {
            self.create(&Value::object([("name", Value::string("i"))]), &Value::Null)
                .await
        }
    }

    const KEPT: &[Credential] = &[Credential {
        attribute: "token",
        description: "deprecated",
    }];

    fn withheld(keep: bool) -> Withheld {
        let provider = Arc::new(ProviderState::default());
        provider.set_keeps_credentials(keep);
        Withheld::new(Arc::new(Keeper), KEPT, provider)
    }

    #[tokio::test]
    async fn without_storing_credentials_no_plan_state_or_import_holds_one() {
        let r = withheld(false);
        let config = Value::object([("name", Value::string("a")), ("token", Value::Null)]);
        let planned = r.plan(None, config.clone(), &config).await.unwrap();
        assert!(planned.state.get("token").is_null(), "planned: known null");
        let created = r.create(&planned.state, &config).await.unwrap();
        assert!(created.get("token").is_null());
        let mut old = created.clone();
        old.set("token", Value::string("gft_kept_before"));
        let read = r.read(&old).await.unwrap().unwrap();
        assert!(
            read.get("token").is_null(),
            "a refresh empties an old state"
        );
        assert!(r.import("x").await.unwrap().get("token").is_null());
    }

    #[tokio::test]
    async fn when_asked_credentials_are_kept_and_the_attribute_is_deprecated() {
        let r = withheld(true);
        let config = Value::object([("name", Value::string("a")), ("token", Value::Null)]);
        let created = r.create(&config, &config).await.unwrap();
        assert_eq!(created.get("token"), &Value::string("gft_secret"));
        let schema = r.schema();
        let token = schema
            .attributes
            .iter()
            .find(|a| a.name == "token")
            .unwrap();
        assert!(token.deprecated && token.sensitive);
        assert_eq!(token.description, "deprecated");
    }
}
