//! `tfplugin6.Provider` over the framework's provider, resources and data sources.
//!
//! Values cross as DynamicValues decoded and encoded with each schema's type. Every
//! problem is a diagnostic in the response, never a gRPC error: Terraform shows
//! diagnostics to the person running it, and treats a gRPC error as a crashed provider.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;

use tonic::{Request, Response, Status};

use super::convert;
pub(super) use super::dynamic::{decode, encode};
use super::identity::Identities;
use super::tfplugin6 as tf;
use super::values::from_json;
use super::write_only;
use crate::framework::{
    ActionType, AttrPath, DataSourceType, Diagnostic, Diagnostics, EphemeralResourceType,
    ListResourceType, ProviderType, ResourceType, Schema, Type, Value,
};

type Reply<T> = Result<Response<T>, Status>;

/// A list's results (`list.rs` makes them).
pub(super) type ListEvents =
    Pin<Box<dyn Stream<Item = Result<tf::list_resource::Event, Status>> + Send>>;
/// An action's progress and outcome (`actions.rs` makes them).
pub(super) type ActionEvents =
    Pin<Box<dyn Stream<Item = Result<tf::invoke_action::Event, Status>> + Send>>;

pub(super) struct Registered<T: ?Sized> {
    pub(super) inner: Arc<T>,
    pub(super) schema: Schema,
    pub(super) ty: Type,
}

impl<T: ?Sized> Registered<T> {
    fn new(inner: Arc<T>, schema: Schema) -> Self {
        let ty = schema.object_type();
        Self { inner, schema, ty }
    }
}

/// The provider as Terraform sees it: its schema, and its resources, data sources,
/// ephemeral resources, list resources and actions by full type name
/// (`<provider>_<name>`), built once.
pub struct ProviderService {
    provider: Registered<dyn ProviderType>,
    pub(super) resources: BTreeMap<String, Registered<dyn ResourceType>>,
    data_sources: BTreeMap<String, Registered<dyn DataSourceType>>,
    pub(super) ephemeral: BTreeMap<String, Registered<dyn EphemeralResourceType>>,
    pub(super) lists: BTreeMap<String, Registered<dyn ListResourceType>>,
    pub(super) actions: BTreeMap<String, Registered<dyn ActionType>>,
    pub(super) identities: Identities,
}

/// `<prefix>_<name>` for each, with its schema.
fn registered<T: ?Sized>(
    prefix: &str,
    items: Vec<Arc<T>>,
    name: impl Fn(&T) -> &'static str,
    schema: impl Fn(&T) -> Schema,
) -> BTreeMap<String, Registered<T>> {
    items
        .into_iter()
        .map(|item| {
            let s = schema(&item);
            (
                format!("{prefix}_{}", name(&item)),
                Registered::new(item, s),
            )
        })
        .collect()
}

impl ProviderService {
    pub fn new(name: &str, provider: Arc<dyn ProviderType>) -> Self {
        let resources = registered(name, provider.resources(), |r| r.name(), |r| r.schema());
        let data_sources = registered(name, provider.data_sources(), |d| d.name(), |d| d.schema());
        let ephemeral = registered(
            name,
            provider.ephemeral_resources(),
            |e| e.name(),
            |e| e.schema(),
        );
        let lists = registered(
            name,
            provider.list_resources(),
            |l| l.name(),
            |l| l.schema(),
        );
        let actions = registered(name, provider.actions(), |a| a.name(), |a| a.schema());
        let identities = Identities::new(name, provider.identities());
        let schema = provider.schema();
        Self {
            provider: Registered::new(provider, schema),
            resources,
            data_sources,
            ephemeral,
            lists,
            actions,
            identities,
        }
    }

    fn resource(&self, type_name: &str) -> Result<&Registered<dyn ResourceType>, Diagnostics> {
        self.resources
            .get(type_name)
            .ok_or_else(|| unknown_type("resource", type_name))
    }

    fn data_source(&self, type_name: &str) -> Result<&Registered<dyn DataSourceType>, Diagnostics> {
        self.data_sources
            .get(type_name)
            .ok_or_else(|| unknown_type("data source", type_name))
    }
}

pub(super) fn unknown_type(kind: &str, type_name: &str) -> Diagnostics {
    Diagnostic::error(
        format!("this provider has no {kind} type {type_name:?}"),
        "",
    )
    .into()
}

/// What the provider offers beyond the basic lifecycle: destroys are planned (some are
/// refused at plan); nothing else (no move, no generated configuration), and the schema
/// must be fetched from each instance.
fn capabilities() -> tf::ServerCapabilities {
    tf::ServerCapabilities {
        plan_destroy: true,
        get_provider_schema_optional: false,
        move_resource_state: false,
        generate_resource_config: false,
    }
}

/// The diagnostics of a result that has no value to return.
fn diags_of<T>(result: Result<T, Diagnostics>) -> Vec<tf::Diagnostic> {
    match result {
        Ok(_) => Vec::new(),
        Err(d) => convert::diagnostics(d),
    }
}

/// A planned change: the planned state, the attributes that force replacement, and for
/// an update in place the prior state (whose identity the plan keeps).
type Planned = (Value, Vec<AttrPath>, Option<Value>);

impl ProviderService {
    async fn plan(&self, req: &tf::plan_resource_change::Request) -> Result<Planned, Diagnostics> {
        let r = self.resource(&req.type_name)?;
        let prior = decode(req.prior_state.as_ref(), &r.ty)?;
        let proposed = decode(req.proposed_new_state.as_ref(), &r.ty)?;
        let config = decode(req.config.as_ref(), &r.ty)?;
        match (prior.is_null(), proposed.is_null()) {
            // Destroy: planned as null, unless the provider refuses it.
            (false, true) => {
                r.inner.plan_delete(&prior).await?;
                Ok((Value::Null, Vec::new(), None))
            }
            (true, false) => {
                let planned = r.inner.plan(None, proposed, &config).await?;
                Ok((
                    write_only::nulled(&r.schema, planned.state),
                    Vec::new(),
                    None,
                ))
            }
            (false, false) => {
                let planned = r.inner.plan(Some(&prior), proposed, &config).await?;
                let in_place = planned.requires_replace.is_empty().then_some(prior);
                Ok((
                    write_only::nulled(&r.schema, planned.state),
                    planned.requires_replace,
                    in_place,
                ))
            }
            (true, true) => Ok((Value::Null, Vec::new(), None)),
        }
    }

    /// The new state after an apply, and the diagnostics. A failed create leaves nothing
    /// (the backend creates atomically); a failed update or delete leaves the prior state,
    /// still the truth (the next refresh corrects anything else).
    async fn apply(
        &self,
        req: &tf::apply_resource_change::Request,
    ) -> (
        Option<tf::DynamicValue>,
        Diagnostics,
        Option<tf::ResourceIdentityData>,
    ) {
        let r = match self.resource(&req.type_name) {
            Ok(r) => r,
            Err(d) => return (req.prior_state.clone(), d, None),
        };
        let decoded = (|| {
            Ok::<_, Diagnostics>((
                decode(req.prior_state.as_ref(), &r.ty)?,
                decode(req.planned_state.as_ref(), &r.ty)?,
                decode(req.config.as_ref(), &r.ty)?,
            ))
        })();
        let (prior, planned, config) = match decoded {
            Ok(values) => values,
            Err(d) => return (req.prior_state.clone(), d, None),
        };
        let outcome = match (prior.is_null(), planned.is_null()) {
            (true, false) => r.inner.create(&planned, &config).await.map(Some),
            (false, false) => r.inner.update(&prior, &planned, &config).await.map(Some),
            (false, true) => r.inner.delete(&prior).await.map(|()| None),
            (true, true) => Ok(None),
        };
        match outcome {
            Ok(Some(state)) => {
                let state = write_only::nulled(&r.schema, state);
                let mut diagnostics = Diagnostics::default();
                // A create (or the create of a replacement) has no identity yet.
                let held = req.planned_identity.as_ref().filter(|_| !prior.is_null());
                let identity = self
                    .identities
                    .kept_or_made(&req.type_name, held, &state, &mut diagnostics)
                    .await;
                (encode(&state, &r.ty), diagnostics, identity)
            }
            Ok(None) => (encode(&Value::Null, &r.ty), Diagnostics::default(), None),
            Err(d) if prior.is_null() => (encode(&Value::Null, &r.ty), d, None),
            Err(d) => (req.prior_state.clone(), d, req.planned_identity.clone()),
        }
    }
}

#[tonic::async_trait]
impl tf::provider_server::Provider for ProviderService {
    async fn get_metadata(
        &self,
        _req: Request<tf::get_metadata::Request>,
    ) -> Reply<tf::get_metadata::Response> {
        Ok(Response::new(tf::get_metadata::Response {
            server_capabilities: Some(capabilities()),
            diagnostics: Vec::new(),
            data_sources: self
                .data_sources
                .keys()
                .map(|n| tf::get_metadata::DataSourceMetadata {
                    type_name: n.clone(),
                })
                .collect(),
            resources: self
                .resources
                .keys()
                .map(|n| tf::get_metadata::ResourceMetadata {
                    type_name: n.clone(),
                })
                .collect(),
            ephemeral_resources: self
                .ephemeral
                .keys()
                .map(|n| tf::get_metadata::EphemeralMetadata {
                    type_name: n.clone(),
                })
                .collect(),
            list_resources: self
                .lists
                .keys()
                .map(|n| tf::get_metadata::ListResourceMetadata {
                    type_name: n.clone(),
                })
                .collect(),
            actions: self
                .actions
                .keys()
                .map(|n| tf::get_metadata::ActionMetadata {
                    type_name: n.clone(),
                })
                .collect(),
        }))
    }

    async fn get_provider_schema(
        &self,
        _req: Request<tf::get_provider_schema::Request>,
    ) -> Reply<tf::get_provider_schema::Response> {
        let schemas = |entries: Vec<(&String, &Schema)>| -> HashMap<String, tf::Schema> {
            entries
                .into_iter()
                .map(|(name, schema)| (name.clone(), convert::schema(schema)))
                .collect()
        };
        Ok(Response::new(tf::get_provider_schema::Response {
            provider: Some(convert::schema(&self.provider.schema)),
            resource_schemas: schemas(self.resources.iter().map(|(n, r)| (n, &r.schema)).collect()),
            data_source_schemas: schemas(
                self.data_sources
                    .iter()
                    .map(|(n, d)| (n, &d.schema))
                    .collect(),
            ),
            diagnostics: Vec::new(),
            provider_meta: None,
            server_capabilities: Some(capabilities()),
            ephemeral_resource_schemas: schemas(
                self.ephemeral.iter().map(|(n, e)| (n, &e.schema)).collect(),
            ),
            list_resource_schemas: schemas(
                self.lists.iter().map(|(n, l)| (n, &l.schema)).collect(),
            ),
            action_schemas: self
                .actions
                .iter()
                .map(|(n, a)| {
                    let schema = Some(convert::schema(&a.schema));
                    (n.clone(), tf::ActionSchema { schema })
                })
                .collect(),
        }))
    }

    async fn validate_provider_config(
        &self,
        req: Request<tf::validate_provider_config::Request>,
    ) -> Reply<tf::validate_provider_config::Response> {
        let req = req.into_inner();
        let result = decode(req.config.as_ref(), &self.provider.ty);
        Ok(Response::new(tf::validate_provider_config::Response {
            diagnostics: diags_of(result),
        }))
    }

    async fn validate_resource_config(
        &self,
        req: Request<tf::validate_resource_config::Request>,
    ) -> Reply<tf::validate_resource_config::Response> {
        let req = req.into_inner();
        let result = async {
            let r = self.resource(&req.type_name)?;
            let config = decode(req.config.as_ref(), &r.ty)?;
            write_only::refuse_without_support(
                &r.schema,
                &config,
                req.client_capabilities.as_ref(),
            )?;
            r.inner.validate(&config).await
        }
        .await;
        Ok(Response::new(tf::validate_resource_config::Response {
            diagnostics: diags_of(result),
        }))
    }

    async fn validate_data_resource_config(
        &self,
        req: Request<tf::validate_data_resource_config::Request>,
    ) -> Reply<tf::validate_data_resource_config::Response> {
        let req = req.into_inner();
        let result = async {
            let d = self.data_source(&req.type_name)?;
            let config = decode(req.config.as_ref(), &d.ty)?;
            d.inner.validate(&config).await
        }
        .await;
        Ok(Response::new(tf::validate_data_resource_config::Response {
            diagnostics: diags_of(result),
        }))
    }

    /// Every schema is version 0: upgrading re-reads the stored JSON with the current
    /// schema (dropping attributes it no longer has, null for new ones).
    async fn upgrade_resource_state(
        &self,
        req: Request<tf::upgrade_resource_state::Request>,
    ) -> Reply<tf::upgrade_resource_state::Response> {
        let req = req.into_inner();
        let result = (|| {
            let r = self.resource(&req.type_name)?;
            if req.version > r.schema.version {
                return Err(Diagnostic::error(
                    format!(
                        "{}: the state was written by a newer provider (schema version {}, this one knows {})",
                        req.type_name, req.version, r.schema.version
                    ),
                    "Use a provider at least as new as the one that wrote the state.",
                )
                .into());
            }
            let raw = req.raw_state.as_ref();
            let json = raw.map(|s| s.json.as_slice()).unwrap_or_default();
            if json.is_empty() {
                return Err(Diagnostic::error(
                    format!(
                        "{}: a legacy (flatmap) state cannot be upgraded",
                        req.type_name
                    ),
                    "",
                )
                .into());
            }
            let value = from_json(json, &r.ty).map_err(Diagnostics::from)?;
            Ok(encode(&value, &r.ty))
        })();
        let (upgraded_state, diagnostics) = match result {
            Ok(state) => (state, Vec::new()),
            Err(d) => (None, convert::diagnostics(d)),
        };
        Ok(Response::new(tf::upgrade_resource_state::Response {
            upgraded_state,
            diagnostics,
        }))
    }

    async fn get_resource_identity_schemas(
        &self,
        _req: Request<tf::get_resource_identity_schemas::Request>,
    ) -> Reply<tf::get_resource_identity_schemas::Response> {
        Ok(Response::new(tf::get_resource_identity_schemas::Response {
            identity_schemas: self.identities.schemas(),
            diagnostics: Vec::new(),
        }))
    }

    async fn upgrade_resource_identity(
        &self,
        req: Request<tf::upgrade_resource_identity::Request>,
    ) -> Reply<tf::upgrade_resource_identity::Response> {
        let (upgraded_identity, diagnostics) = match self.identities.upgrade(&req.into_inner()) {
            Ok(identity) => (Some(identity), Vec::new()),
            Err(d) => (None, convert::diagnostics(d)),
        };
        Ok(Response::new(tf::upgrade_resource_identity::Response {
            upgraded_identity,
            diagnostics,
        }))
    }

    async fn configure_provider(
        &self,
        req: Request<tf::configure_provider::Request>,
    ) -> Reply<tf::configure_provider::Response> {
        let req = req.into_inner();
        let result = async {
            let config = decode(req.config.as_ref(), &self.provider.ty)?;
            self.provider.inner.configure(&config).await
        }
        .await;
        Ok(Response::new(tf::configure_provider::Response {
            diagnostics: diags_of(result),
        }))
    }

    /// A resource gone from the backend answers a null state (Terraform plans a create);
    /// one that could not be read, or that another tenant's token cannot see, keeps its
    /// state, with the error.
    async fn read_resource(
        &self,
        req: Request<tf::read_resource::Request>,
    ) -> Reply<tf::read_resource::Response> {
        let req = req.into_inner();
        let result = async {
            let r = self.resource(&req.type_name)?;
            let prior = decode(req.current_state.as_ref(), &r.ty)?;
            let current = r.inner.read(&prior).await?;
            if current.is_none() && !prior.is_null() {
                self.identities
                    .confirm_gone(&req.type_name, req.current_identity.as_ref(), &prior)
                    .await?;
            }
            let current = write_only::nulled(&r.schema, current.unwrap_or(Value::Null));
            let mut warnings = Diagnostics::default();
            let identity = self
                .identities
                .kept_or_made(
                    &req.type_name,
                    req.current_identity.as_ref(),
                    &current,
                    &mut warnings,
                )
                .await;
            Ok((encode(&current, &r.ty), identity, warnings))
        }
        .await;
        let (new_state, new_identity, diagnostics) = match result {
            Ok((state, identity, warnings)) => (state, identity, convert::diagnostics(warnings)),
            Err(d) => (
                req.current_state,
                req.current_identity,
                convert::diagnostics(d),
            ),
        };
        Ok(Response::new(tf::read_resource::Response {
            new_state,
            diagnostics,
            private: req.private,
            new_identity,
        }))
    }

    async fn plan_resource_change(
        &self,
        req: Request<tf::plan_resource_change::Request>,
    ) -> Reply<tf::plan_resource_change::Response> {
        let req = req.into_inner();
        let (planned_state, requires_replace, planned_identity, diagnostics) =
            match self.plan(&req).await {
                Ok((state, replace, in_place)) => {
                    let ty = &self.resources[&req.type_name].ty;
                    // An update in place keeps the object's identity; a create or a
                    // replacement has none until apply.
                    let mut warnings = Diagnostics::default();
                    let identity = match &in_place {
                        Some(prior) => {
                            warnings.0.extend(
                                self.resources[&req.type_name]
                                    .inner
                                    .plan_warnings(prior, &state)
                                    .0,
                            );
                            self.identities
                                .kept_or_made(
                                    &req.type_name,
                                    req.prior_identity.as_ref(),
                                    prior,
                                    &mut warnings,
                                )
                                .await
                        }
                        None => {
                            // A create (or a replacement's create half): no prior.
                            if replace.is_empty() {
                                warnings.0.extend(
                                    self.resources[&req.type_name]
                                        .inner
                                        .plan_warnings(&Value::Null, &state)
                                        .0,
                                );
                            }
                            None
                        }
                    };
                    (
                        encode(&state, ty),
                        replace.iter().map(convert::attribute_path).collect(),
                        identity,
                        convert::diagnostics(warnings),
                    )
                }
                Err(d) => (None, Vec::new(), None, convert::diagnostics(d)),
            };
        Ok(Response::new(tf::plan_resource_change::Response {
            planned_state,
            requires_replace,
            planned_private: req.prior_private,
            diagnostics,
            planned_identity,
        }))
    }

    async fn apply_resource_change(
        &self,
        req: Request<tf::apply_resource_change::Request>,
    ) -> Reply<tf::apply_resource_change::Response> {
        let req = req.into_inner();
        let (new_state, diagnostics, new_identity) = self.apply(&req).await;
        Ok(Response::new(tf::apply_resource_change::Response {
            new_state,
            private: Vec::new(),
            diagnostics: convert::diagnostics(diagnostics),
            new_identity,
        }))
    }

    async fn import_resource_state(
        &self,
        req: Request<tf::import_resource_state::Request>,
    ) -> Reply<tf::import_resource_state::Response> {
        let req = req.into_inner();
        let result = async {
            let r = self.resource(&req.type_name)?;
            // `import { identity = {...} }` sends the identity and no id.
            let id = match (&req.identity, req.id.is_empty()) {
                (Some(identity), true) => self.identities.import_id(&req.type_name, identity)?,
                _ => req.id.clone(),
            };
            let state = write_only::nulled(&r.schema, r.inner.import(&id).await?);
            // Made afresh: the identity of the object found, whichever way the import
            // spelled it (a tenant's id becomes its name).
            let mut warnings = Diagnostics::default();
            let identity = self
                .identities
                .kept_or_made(&req.type_name, None, &state, &mut warnings)
                .await;
            let imported = tf::import_resource_state::ImportedResource {
                type_name: req.type_name.clone(),
                state: encode(&state, &r.ty),
                private: Vec::new(),
                identity,
            };
            Ok((imported, warnings))
        }
        .await;
        let (imported_resources, diagnostics) = match result {
            Ok((imported, warnings)) => (vec![imported], convert::diagnostics(warnings)),
            Err(d) => (Vec::new(), convert::diagnostics(d)),
        };
        Ok(Response::new(tf::import_resource_state::Response {
            imported_resources,
            diagnostics,
        }))
    }

    async fn read_data_source(
        &self,
        req: Request<tf::read_data_source::Request>,
    ) -> Reply<tf::read_data_source::Response> {
        let req = req.into_inner();
        let result = async {
            let d = self.data_source(&req.type_name)?;
            let config = decode(req.config.as_ref(), &d.ty)?;
            let state = d.inner.read(&config).await?;
            Ok(encode(&state, &d.ty))
        }
        .await;
        let (state, diagnostics) = match result {
            Ok(state) => (state, Vec::new()),
            Err(d) => (None, convert::diagnostics(d)),
        };
        Ok(Response::new(tf::read_data_source::Response {
            state,
            diagnostics,
        }))
    }

    async fn validate_ephemeral_resource_config(
        &self,
        req: Request<tf::validate_ephemeral_resource_config::Request>,
    ) -> Reply<tf::validate_ephemeral_resource_config::Response> {
        Ok(Response::new(
            self.validate_ephemeral(req.into_inner()).await,
        ))
    }

    async fn open_ephemeral_resource(
        &self,
        req: Request<tf::open_ephemeral_resource::Request>,
    ) -> Reply<tf::open_ephemeral_resource::Response> {
        Ok(Response::new(self.open_ephemeral(req.into_inner()).await))
    }

    async fn renew_ephemeral_resource(
        &self,
        req: Request<tf::renew_ephemeral_resource::Request>,
    ) -> Reply<tf::renew_ephemeral_resource::Response> {
        Ok(Response::new(self.renew_ephemeral(req.into_inner()).await))
    }

    async fn close_ephemeral_resource(
        &self,
        req: Request<tf::close_ephemeral_resource::Request>,
    ) -> Reply<tf::close_ephemeral_resource::Response> {
        Ok(Response::new(self.close_ephemeral(req.into_inner()).await))
    }

    async fn get_functions(
        &self,
        _req: Request<tf::get_functions::Request>,
    ) -> Reply<tf::get_functions::Response> {
        Ok(Response::new(tf::get_functions::Response {
            functions: HashMap::new(),
            diagnostics: Vec::new(),
        }))
    }

    type ListResourceStream = ListEvents;

    async fn list_resource(
        &self,
        req: Request<tf::list_resource::Request>,
    ) -> Reply<Self::ListResourceStream> {
        Ok(Response::new(self.list(req.into_inner()).await))
    }

    async fn validate_list_resource_config(
        &self,
        req: Request<tf::validate_list_resource_config::Request>,
    ) -> Reply<tf::validate_list_resource_config::Response> {
        Ok(Response::new(self.validate_list(req.into_inner()).await))
    }

    async fn validate_action_config(
        &self,
        req: Request<tf::validate_action_config::Request>,
    ) -> Reply<tf::validate_action_config::Response> {
        Ok(Response::new(self.validate_action(req.into_inner()).await))
    }

    async fn plan_action(
        &self,
        req: Request<tf::plan_action::Request>,
    ) -> Reply<tf::plan_action::Response> {
        Ok(Response::new(
            self.plan_action_config(req.into_inner()).await,
        ))
    }

    type InvokeActionStream = ActionEvents;

    async fn invoke_action(
        &self,
        req: Request<tf::invoke_action::Request>,
    ) -> Reply<Self::InvokeActionStream> {
        Ok(Response::new(self.invoke(req.into_inner())))
    }

    /// Terraform asks in-flight work to stop (an interrupted run). Each call already ends
    /// at its own deadline; there is nothing long-running to cancel besides.
    async fn stop_provider(
        &self,
        _req: Request<tf::stop_provider::Request>,
    ) -> Reply<tf::stop_provider::Response> {
        Ok(Response::new(tf::stop_provider::Response {
            error: String::new(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::{Attribute, PlannedChange};
    use async_trait::async_trait;
    use tf::provider_server::Provider;

    /// A resource whose create fails when its name is "fail", and whose delete always
    /// fails: enough to see what each RPC answers.
    struct Widget;

    #[async_trait]
    impl ResourceType for Widget {
        fn name(&self) -> &'static str {
            "widget"
        }
        fn schema(&self) -> Schema {
            Schema::new(
                "w",
                vec![
                    Attribute::required("name", Type::String, "n"),
                    Attribute::computed("id", Type::String, "i"),
                ],
            )
        }
        async fn read(&self, state: &Value) -> Result<Option<Value>, Diagnostics> {
            Ok((state.str_attr("id").unwrap() != Some("gone")).then(|| state.clone()))
        }
        async fn plan(
            &self,
            _prior: Option<&Value>,
            mut proposed: Value,
            _config: &Value,
        ) -> Result<PlannedChange, Diagnostics> {
            proposed.set("id", Value::Unknown);
            Ok(PlannedChange {
                state: proposed,
                requires_replace: vec![AttrPath::attr("name")],
            })
        }
        async fn create(&self, planned: &Value, _config: &Value) -> Result<Value, Diagnostics> {
            if planned.str_attr("name").unwrap() == Some("fail") {
                let mut d = Diagnostics::default();
                d.attr_error("name", "refused");
                return Err(d);
            }
            let mut state = planned.clone();
            state.set("id", Value::string("w-1"));
            Ok(state)
        }
        async fn update(
            &self,
            _p: &Value,
            planned: &Value,
            _c: &Value,
        ) -> Result<Value, Diagnostics> {
            Ok(planned.clone())
        }
        async fn delete(&self, _prior: &Value) -> Result<(), Diagnostics> {
            Err(Diagnostic::error("cannot delete", "").into())
        }
        async fn import(&self, id: &str) -> Result<Value, Diagnostics> {
            Ok(Value::object([
                ("name", Value::string("imported")),
                ("id", Value::string(id)),
            ]))
        }
    }

    struct Prov;

    #[async_trait]
    impl ProviderType for Prov {
        fn schema(&self) -> Schema {
            Schema::new(
                "p",
                vec![Attribute::optional("endpoint", Type::String, "e")],
            )
        }
        async fn configure(&self, _config: &Value) -> Result<(), Diagnostics> {
            Ok(())
        }
        fn resources(&self) -> Vec<Arc<dyn ResourceType>> {
            vec![Arc::new(Widget)]
        }
        fn data_sources(&self) -> Vec<Arc<dyn DataSourceType>> {
            Vec::new()
        }
    }

    fn service() -> ProviderService {
        ProviderService::new("test", Arc::new(Prov))
    }

    fn widget_ty() -> Type {
        Widget.schema().object_type()
    }

    fn dv(v: &Value) -> Option<tf::DynamicValue> {
        encode(v, &widget_ty())
    }

    fn state_of(v: &Option<tf::DynamicValue>) -> Value {
        decode(v.as_ref(), &widget_ty()).unwrap()
    }

    #[tokio::test]
    async fn the_schema_names_types_with_the_provider_prefix_and_plans_destroys() {
        let s = service()
            .get_provider_schema(Request::new(Default::default()))
            .await
            .unwrap()
            .into_inner();
        assert!(s.resource_schemas.contains_key("test_widget"));
        assert!(s.server_capabilities.unwrap().plan_destroy);
    }

    #[tokio::test]
    async fn plans_create_update_and_destroy_by_which_values_are_null() {
        let svc = service();
        let config = Value::object([("name", Value::string("a")), ("id", Value::Null)]);
        let create = svc
            .plan_resource_change(Request::new(tf::plan_resource_change::Request {
                type_name: "test_widget".into(),
                prior_state: dv(&Value::Null),
                proposed_new_state: dv(&config),
                config: dv(&config),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        assert!(state_of(&create.planned_state).get("id").is_unknown());
        assert!(create.requires_replace.is_empty(), "no replace on create");

        let prior = Value::object([("name", Value::string("a")), ("id", Value::string("w-1"))]);
        let update = svc
            .plan_resource_change(Request::new(tf::plan_resource_change::Request {
                type_name: "test_widget".into(),
                prior_state: dv(&prior),
                proposed_new_state: dv(&config),
                config: dv(&config),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(update.requires_replace.len(), 1);

        let destroy = svc
            .plan_resource_change(Request::new(tf::plan_resource_change::Request {
                type_name: "test_widget".into(),
                prior_state: dv(&prior),
                proposed_new_state: dv(&Value::Null),
                config: dv(&Value::Null),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        assert!(state_of(&destroy.planned_state).is_null());
    }

    #[tokio::test]
    async fn a_failed_create_leaves_nothing_and_a_failed_delete_keeps_the_prior_state() {
        let svc = service();
        let failing = Value::object([("name", Value::string("fail")), ("id", Value::Unknown)]);
        let created = svc
            .apply_resource_change(Request::new(tf::apply_resource_change::Request {
                type_name: "test_widget".into(),
                prior_state: dv(&Value::Null),
                planned_state: dv(&failing),
                config: dv(&failing),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        assert!(state_of(&created.new_state).is_null());
        assert_eq!(created.diagnostics[0].summary, "name: refused");

        let prior = Value::object([("name", Value::string("a")), ("id", Value::string("w-1"))]);
        let deleted = svc
            .apply_resource_change(Request::new(tf::apply_resource_change::Request {
                type_name: "test_widget".into(),
                prior_state: dv(&prior),
                planned_state: dv(&Value::Null),
                config: dv(&Value::Null),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(state_of(&deleted.new_state), prior);
        assert_eq!(deleted.diagnostics.len(), 1);
    }

    #[tokio::test]
    async fn a_resource_gone_reads_as_null_and_import_returns_its_state() {
        let svc = service();
        let gone = Value::object([("name", Value::string("a")), ("id", Value::string("gone"))]);
        let read = svc
            .read_resource(Request::new(tf::read_resource::Request {
                type_name: "test_widget".into(),
                current_state: dv(&gone),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        assert!(state_of(&read.new_state).is_null());

        let imported = svc
            .import_resource_state(Request::new(tf::import_resource_state::Request {
                type_name: "test_widget".into(),
                id: "w-9".into(),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        let state = state_of(&imported.imported_resources[0].state);
        assert_eq!(state.get("id"), &Value::string("w-9"));
    }

    #[tokio::test]
    async fn an_unknown_type_is_a_diagnostic_not_a_grpc_error() {
        let reply = service()
            .validate_resource_config(Request::new(tf::validate_resource_config::Request {
                type_name: "test_nothing".into(),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        assert!(reply.diagnostics[0].summary.contains("test_nothing"));
    }

    #[tokio::test]
    async fn a_stored_json_state_upgrades_to_msgpack() {
        let reply = service()
            .upgrade_resource_state(Request::new(tf::upgrade_resource_state::Request {
                type_name: "test_widget".into(),
                version: 0,
                raw_state: Some(tf::RawState {
                    json: br#"{"name":"a","id":"w-1","removed":1}"#.to_vec(),
                    flatmap: HashMap::new(),
                }),
            }))
            .await
            .unwrap()
            .into_inner();
        assert!(reply.diagnostics.is_empty(), "{:?}", reply.diagnostics);
        let state = state_of(&reply.upgraded_state);
        assert_eq!(state.get("id"), &Value::string("w-1"));
    }
}
