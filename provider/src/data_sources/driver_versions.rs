//! `gpufleet_driver_versions`: the NVIDIA drivers the platform offers, optionally only those
//! for one GPU model and/or one CUDA version, newest first: what a cluster's
//! `driver_version` may be.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;
use tonic::{Code, Status};

use crate::framework::{
    AttrPath, Attribute, DataSourceType, Diagnostic, Diagnostics, Schema, Type, Value,
};
use crate::state::ProviderState;

pub struct DriverVersions {
    provider: Arc<ProviderState>,
}

impl DriverVersions {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

fn driver_type() -> Type {
    Type::object([
        ("version", Type::String),
        ("branch", Type::String),
        ("cuda_version", Type::String),
        ("end_of_life", Type::String),
    ])
}

fn driver_value(d: &api::DriverVersion) -> Value {
    Value::object([
        ("version", Value::string(&d.version)),
        ("branch", Value::string(&d.branch)),
        ("cuda_version", Value::string(&d.cuda_version)),
        ("end_of_life", Value::string(&d.end_of_life)),
    ])
}

/// The state for the backend's answer to `config`.
fn answer_state(
    config: &Value,
    gpu_type: &str,
    cuda_version: &str,
    drivers: &[api::DriverVersion],
) -> Value {
    let mut state = config.clone();
    state.set(
        "id",
        Value::String(format!("driver_versions/{gpu_type}/{cuda_version}")),
    );
    state.set(
        "drivers",
        Value::List(drivers.iter().map(driver_value).collect()),
    );
    state.set(
        "latest",
        drivers
            .first()
            .map_or(Value::Null, |d| Value::string(&d.version)),
    );
    state
}

/// The backend's refusal of a filter (INVALID_ARGUMENT whose details name `gpu_type` or
/// `cuda_version`), said on that argument.
fn filter_refusal(status: &Status) -> Option<Diagnostic> {
    if status.code() != Code::InvalidArgument {
        return None;
    }
    let (field, _) = crate::resources::checks::refused_field(status)?;
    ["gpu_type", "cuda_version"]
        .into_iter()
        .find(|f| *f == field)
        .map(|f| Diagnostic::error_at(AttrPath::attr(f), status.message(), ""))
}

fn filter(config: &Value, name: &str) -> Result<String, Diagnostics> {
    Ok(config
        .str_attr(name)
        .map_err(Diagnostics::from)?
        .unwrap_or_default()
        .to_string())
}

#[async_trait]
impl DataSourceType for DriverVersions {
    fn name(&self) -> &'static str {
        "driver_versions"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "The NVIDIA drivers the platform offers for tenant clusters, newest first, optionally only those for one GPU model and/or CUDA version.",
            vec![
                Attribute::computed("id", Type::String, "An id made of the filters."),
                Attribute::optional(
                    "gpu_type",
                    Type::String,
                    "Only drivers that support this GPU model, e.g. `H100-80GB`.",
                ),
                Attribute::optional(
                    "cuda_version",
                    Type::String,
                    "Only drivers that run this CUDA version, e.g. `12.4`.",
                ),
                Attribute::computed(
                    "drivers",
                    Type::list(driver_type()),
                    "The matching drivers, newest first.",
                ),
                Attribute::computed(
                    "latest",
                    Type::String,
                    "The newest matching driver's version; null when none matches.",
                ),
            ],
        )
    }

    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let mut diags = Diagnostics::default();
        for name in ["gpu_type", "cuda_version"] {
            match config.str_attr(name) {
                Ok(Some("")) => diags.attr_error(name, "must not be empty; leave it out instead"),
                Ok(_) => {}
                Err(d) => diags.push(d),
            }
        }
        diags.into_result()
    }

    async fn read(&self, config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let gpu_type = filter(config, "gpu_type")?;
        let cuda_version = filter(config, "cuda_version")?;
        let request = api::ListDriverVersionsRequest {
            gpu_type: gpu_type.clone(),
            cuda_version: cuda_version.clone(),
        };
        let drivers = client
            .fleet()
            .list_driver_versions(request)
            .await
            .map_err(|s| {
                Diagnostics::from(filter_refusal(&s).unwrap_or_else(|| client.diagnostic(&s)))
            })?
            .into_inner()
            .drivers;
        Ok(answer_state(config, &gpu_type, &cuda_version, &drivers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(gpu_type: Option<&str>, cuda: Option<&str>) -> Value {
        Value::object([
            ("id", Value::Null),
            ("gpu_type", gpu_type.map_or(Value::Null, Value::string)),
            ("cuda_version", cuda.map_or(Value::Null, Value::string)),
            ("drivers", Value::Null),
            ("latest", Value::Null),
        ])
    }

    fn release(version: &str, branch: &str, cuda: &str) -> api::DriverVersion {
        api::DriverVersion {
            version: version.into(),
            branch: branch.into(),
            cuda_version: cuda.into(),
            end_of_life: "August 2028".into(),
        }
    }

    #[test]
    fn latest_is_the_first_driver_and_the_id_names_the_filters() {
        let drivers = [
            release("580.173.02", "R580", "13.0"),
            release("570.211.01", "R570", "12.8"),
        ];
        let state = answer_state(&config(Some("B200"), None), "B200", "", &drivers);
        assert_eq!(state.get("id"), &Value::string("driver_versions/B200/"));
        assert_eq!(state.get("latest"), &Value::string("580.173.02"));
        assert_eq!(state.get("gpu_type"), &Value::string("B200"));
        assert_eq!(state.get("cuda_version"), &Value::Null);
        let Value::List(listed) = state.get("drivers") else {
            panic!("drivers is not a list");
        };
        assert_eq!(listed.len(), 2);
        assert_eq!(
            listed[1],
            Value::object([
                ("version", Value::string("570.211.01")),
                ("branch", Value::string("R570")),
                ("cuda_version", Value::string("12.8")),
                ("end_of_life", Value::string("August 2028")),
            ])
        );
    }

    #[test]
    fn no_driver_means_a_null_latest() {
        let state = answer_state(&config(None, Some("13.0")), "", "13.0", &[]);
        assert_eq!(state.get("latest"), &Value::Null);
        assert_eq!(state.get("drivers"), &Value::List(vec![]));
        assert_eq!(state.get("id"), &Value::string("driver_versions//13.0"));
    }

    #[test]
    fn a_refused_filter_is_said_on_its_argument() {
        let d = filter_refusal(&crate::resources::checks::as_sent(
            Code::InvalidArgument,
            "cuda_version: unknown CUDA version '12.7' (known: 12.2, 12.4)",
        ))
        .unwrap();
        assert_eq!(d.path, Some(AttrPath::attr("cuda_version")));
        assert_eq!(
            d.summary,
            "cuda_version: unknown CUDA version '12.7' (known: 12.2, 12.4)"
        );
        let d = filter_refusal(&crate::resources::checks::as_sent(
            Code::InvalidArgument,
            "gpu_type: unknown GPU model 'X'",
        ))
        .unwrap();
        assert_eq!(d.path, Some(AttrPath::attr("gpu_type")));
        assert_eq!(
            filter_refusal(&crate::resources::checks::as_sent(
                Code::InvalidArgument,
                "other"
            )),
            None
        );
        assert_eq!(filter_refusal(&Status::unavailable("down")), None);
    }

    #[tokio::test]
    async fn empty_filters_are_refused() {
        let ds = DriverVersions::new(Arc::new(ProviderState::default()));
        let err = ds.validate(&config(Some(""), Some(""))).await.unwrap_err();
        let summaries: Vec<&str> = err.0.iter().map(|d| d.summary.as_str()).collect();
        assert_eq!(
            summaries,
            vec![
                "gpu_type: must not be empty; leave it out instead",
                "cuda_version: must not be empty; leave it out instead"
            ]
        );
        ds.validate(&config(Some("H100-80GB"), None)).await.unwrap();
    }
}
