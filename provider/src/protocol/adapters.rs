//! tf-provider's `Provider`, `Resource` and `DataSource` implemented on top of the
//! framework's traits. States cross this border as `ValueAny` and are converted with the
//! resource's schema type.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use tf_provider::schema::Schema as TfSchema;
use tf_provider::value::{ValueAny, ValueEmpty};
use tf_provider::{
    AttributePath, Diagnostics as TfDiagnostics, DynamicDataSource, DynamicResource,
};

use super::convert::{attribute_path, from_tf, push_diagnostics, to_tf, to_tf_schema};
use crate::framework::{
    AttrPath, DataSourceType, Diagnostics, ProviderType, ResourceType, Type, Value,
};

/// Decodes `raw` with `ty`, recording a type error in `diags`.
fn decode(diags: &mut TfDiagnostics, raw: ValueAny, ty: &Type) -> Option<Value> {
    match from_tf(raw, ty, &AttrPath::root()) {
        Ok(v) => Some(v),
        Err(d) => {
            push_diagnostics(diags, d.into());
            None
        }
    }
}

/// The value on success; `None` with the diagnostics recorded on failure.
fn settle<T>(diags: &mut TfDiagnostics, result: Result<T, Diagnostics>) -> Option<T> {
    match result {
        Ok(v) => Some(v),
        Err(d) => {
            push_diagnostics(diags, d);
            None
        }
    }
}

pub struct ResourceAdapter {
    inner: Arc<dyn ResourceType>,
    ty: Type,
}

impl ResourceAdapter {
    pub fn new(inner: Arc<dyn ResourceType>) -> Self {
        let ty = inner.schema().object_type();
        Self { inner, ty }
    }
}

#[async_trait]
impl tf_provider::Resource for ResourceAdapter {
    type State<'a> = ValueAny;
    type PrivateState<'a> = ValueEmpty;
    type ProviderMetaState<'a> = ValueAny;

    fn schema(&self, _diags: &mut TfDiagnostics) -> Option<TfSchema> {
        Some(to_tf_schema(&self.inner.schema()))
    }

    async fn validate<'a>(&self, diags: &mut TfDiagnostics, config: ValueAny) -> Option<()> {
        let config = decode(diags, config, &self.ty)?;
        settle(diags, self.inner.validate(&config).await)
    }

    async fn read<'a>(
        &self,
        diags: &mut TfDiagnostics,
        state: ValueAny,
        _private: ValueEmpty,
        _meta: ValueAny,
    ) -> Option<(ValueAny, ValueEmpty)> {
        let prior = decode(diags, state.clone(), &self.ty)?;
        match self.inner.read(&prior).await {
            Ok(Some(current)) => Some((to_tf(&current, &self.ty), ValueEmpty::Null)),
            // Gone: a null state makes Terraform drop it and plan a create.
            Ok(None) => None,
            // Could not read: keep the state as it was, with the error.
            Err(d) => {
                push_diagnostics(diags, d);
                Some((state, ValueEmpty::Null))
            }
        }
    }

    async fn plan_create<'a>(
        &self,
        diags: &mut TfDiagnostics,
        proposed: ValueAny,
        config: ValueAny,
        _meta: ValueAny,
    ) -> Option<(ValueAny, ValueEmpty)> {
        let proposed = decode(diags, proposed, &self.ty)?;
        let config = decode(diags, config, &self.ty)?;
        let planned = settle(diags, self.inner.plan(None, proposed, &config).await)?;
        Some((to_tf(&planned.state, &self.ty), ValueEmpty::Null))
    }

    async fn plan_update<'a>(
        &self,
        diags: &mut TfDiagnostics,
        prior: ValueAny,
        proposed: ValueAny,
        config: ValueAny,
        _private: ValueEmpty,
        _meta: ValueAny,
    ) -> Option<(ValueAny, ValueEmpty, Vec<AttributePath>)> {
        let prior = decode(diags, prior, &self.ty)?;
        let proposed = decode(diags, proposed, &self.ty)?;
        let config = decode(diags, config, &self.ty)?;
        let planned = settle(
            diags,
            self.inner.plan(Some(&prior), proposed, &config).await,
        )?;
        let replace = planned
            .requires_replace
            .iter()
            .map(attribute_path)
            .collect();
        Some((to_tf(&planned.state, &self.ty), ValueEmpty::Null, replace))
    }

    async fn plan_destroy<'a>(
        &self,
        diags: &mut TfDiagnostics,
        prior: ValueAny,
        _private: ValueEmpty,
        _meta: ValueAny,
    ) -> Option<ValueEmpty> {
        let prior = decode(diags, prior, &self.ty)?;
        settle(diags, self.inner.plan_delete(&prior).await)?;
        Some(ValueEmpty::Null)
    }

    async fn create<'a>(
        &self,
        diags: &mut TfDiagnostics,
        planned: ValueAny,
        config: ValueAny,
        _private: ValueEmpty,
        _meta: ValueAny,
    ) -> Option<(ValueAny, ValueEmpty)> {
        let planned = decode(diags, planned, &self.ty)?;
        let config = decode(diags, config, &self.ty)?;
        // On failure no state is returned: the backend creates atomically, so nothing exists.
        let created = settle(diags, self.inner.create(&planned, &config).await)?;
        Some((to_tf(&created, &self.ty), ValueEmpty::Null))
    }

    async fn update<'a>(
        &self,
        diags: &mut TfDiagnostics,
        prior: ValueAny,
        planned: ValueAny,
        config: ValueAny,
        _private: ValueEmpty,
        _meta: ValueAny,
    ) -> Option<(ValueAny, ValueEmpty)> {
        let prior_value = decode(diags, prior.clone(), &self.ty)?;
        let planned = decode(diags, planned, &self.ty)?;
        let config = decode(diags, config, &self.ty)?;
        match self.inner.update(&prior_value, &planned, &config).await {
            Ok(updated) => Some((to_tf(&updated, &self.ty), ValueEmpty::Null)),
            // The backend refused or failed the change as a whole: the prior state is
            // still the truth (the next refresh corrects anything else).
            Err(d) => {
                push_diagnostics(diags, d);
                Some((prior, ValueEmpty::Null))
            }
        }
    }

    async fn destroy<'a>(
        &self,
        diags: &mut TfDiagnostics,
        prior: ValueAny,
        _private: ValueEmpty,
        _meta: ValueAny,
    ) -> Option<()> {
        let prior = decode(diags, prior, &self.ty)?;
        settle(diags, self.inner.delete(&prior).await)
    }

    async fn import<'a>(
        &self,
        diags: &mut TfDiagnostics,
        id: String,
    ) -> Option<(ValueAny, ValueEmpty)> {
        let imported = settle(diags, self.inner.import(&id).await)?;
        Some((to_tf(&imported, &self.ty), ValueEmpty::Null))
    }
}

pub struct DataSourceAdapter {
    inner: Arc<dyn DataSourceType>,
    ty: Type,
}

impl DataSourceAdapter {
    pub fn new(inner: Arc<dyn DataSourceType>) -> Self {
        let ty = inner.schema().object_type();
        Self { inner, ty }
    }
}

#[async_trait]
impl tf_provider::DataSource for DataSourceAdapter {
    type State<'a> = ValueAny;
    type ProviderMetaState<'a> = ValueAny;

    fn schema(&self, _diags: &mut TfDiagnostics) -> Option<TfSchema> {
        Some(to_tf_schema(&self.inner.schema()))
    }

    async fn validate<'a>(&self, diags: &mut TfDiagnostics, config: ValueAny) -> Option<()> {
        let config = decode(diags, config, &self.ty)?;
        settle(diags, self.inner.validate(&config).await)
    }

    async fn read<'a>(
        &self,
        diags: &mut TfDiagnostics,
        config: ValueAny,
        _meta: ValueAny,
    ) -> Option<ValueAny> {
        let config = decode(diags, config, &self.ty)?;
        let state = settle(diags, self.inner.read(&config).await)?;
        Some(to_tf(&state, &self.ty))
    }
}

pub struct ProviderAdapter {
    inner: Arc<dyn ProviderType>,
    ty: Type,
}

impl ProviderAdapter {
    pub fn new(inner: Arc<dyn ProviderType>) -> Self {
        let ty = inner.schema().object_type();
        Self { inner, ty }
    }
}

#[async_trait]
impl tf_provider::Provider for ProviderAdapter {
    type Config<'a> = ValueAny;
    type MetaState<'a> = ValueAny;

    fn schema(&self, _diags: &mut TfDiagnostics) -> Option<TfSchema> {
        Some(to_tf_schema(&self.inner.schema()))
    }

    async fn configure<'a>(
        &self,
        diags: &mut TfDiagnostics,
        _terraform_version: String,
        config: ValueAny,
    ) -> Option<()> {
        let config = decode(diags, config, &self.ty)?;
        settle(diags, self.inner.configure(&config).await)
    }

    fn get_resources(
        &self,
        _diags: &mut TfDiagnostics,
    ) -> Option<HashMap<String, Box<dyn DynamicResource>>> {
        Some(
            self.inner
                .resources()
                .into_iter()
                .map(|r| (r.name().to_string(), ResourceAdapter::new(r).into()))
                .collect(),
        )
    }

    fn get_data_sources(
        &self,
        _diags: &mut TfDiagnostics,
    ) -> Option<HashMap<String, Box<dyn DynamicDataSource>>> {
        Some(
            self.inner
                .data_sources()
                .into_iter()
                .map(|d| (d.name().to_string(), DataSourceAdapter::new(d).into()))
                .collect(),
        )
    }
}
