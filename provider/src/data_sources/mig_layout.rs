//! `gpufleet_mig_layout`: whether a per-GPU MIG layout fits a model, and how, asked of the
//! backend's planner without creating anything.
//!
//! A layout that does not fit is an answer (`fits = false`, with the rule and the nearest
//! valid layouts), not an error, so configurations can test it in a `check` block or a
//! `precondition`. A model the question has no answer for (unknown, or without MIG) is an
//! error on `gpu_type`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;
use tonic::{Code, Status};

use super::required_arg;
use crate::framework::{
    AttrPath, Attribute, DataSourceType, Diagnostic, Diagnostics, Schema, Type, Value,
};
use crate::state::ProviderState;

pub struct MigLayout {
    provider: Arc<ProviderState>,
}

impl MigLayout {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

fn placement_type() -> Type {
    Type::object([
        ("profile", Type::String),
        ("profile_id", Type::Number),
        ("start", Type::Number),
        ("size", Type::Number),
    ])
}

/// Errors for the known counts of `layout` below 0, each on its own map key.
fn count_errors(config: &Value) -> Diagnostics {
    let mut diags = Diagnostics::default();
    match config.number_map_attr("layout") {
        Ok(Some(layout)) => {
            for (profile, count) in layout.into_iter().filter(|(_, c)| *c < 0) {
                diags.push(Diagnostic::error_at(
                    AttrPath::attr("layout").key(&profile),
                    format!("layout[{profile:?}]: must be at least 0 (got {count})"),
                    "",
                ));
            }
        }
        Ok(None) => {}
        Err(d) => diags.push(d),
    }
    diags
}

/// The layout as the API takes it; a count beyond i32 is clamped, which the planner
/// refuses like any count above the profile's maximum.
fn request_layout(layout: &BTreeMap<String, i64>) -> HashMap<String, i32> {
    layout
        .iter()
        .map(|(profile, count)| {
            let count = i32::try_from(*count).unwrap_or(i32::MAX);
            (profile.clone(), count)
        })
        .collect()
}

/// `<gpu_type>:<profile>=<count>,...` in profile name order, e.g.
/// `H100-80GB:1g.10gb=2,3g.40gb=1`; `H100-80GB:` for an empty layout.
fn layout_id(gpu_type: &str, layout: &BTreeMap<String, i64>) -> String {
    let entries: Vec<String> = layout
        .iter()
        .map(|(profile, count)| format!("{profile}={count}"))
        .collect();
    format!("{gpu_type}:{}", entries.join(","))
}

/// The backend's refusal of the model, when that is what it refused. INVALID_ARGUMENT is
/// about the model (the counts were checked before asking): its message, which names the
/// field as the cluster resource calls it, is said on `gpu_type`, the attribute that has to
/// change here.
fn model_refusal(status: &Status) -> Option<Diagnostic> {
    if status.code() != Code::InvalidArgument {
        return None;
    }
    // Its reason without the field the cluster resource would name (`gpu_type` or
    // `mig_layout`): what is said here is about the model.
    let reason = match crate::resources::checks::refused_field(status) {
        Some((_, description)) if !description.is_empty() => description,
        _ => status.message().to_string(),
    };
    Some(Diagnostic::error_at(
        AttrPath::attr("gpu_type"),
        format!("gpu_type: {reason}"),
        "",
    ))
}

/// The state for the planner's answer to `config`.
fn answer_state(
    config: &Value,
    gpu_type: &str,
    layout: &BTreeMap<String, i64>,
    answer: &api::CheckMigLayoutResponse,
) -> Value {
    let placements = answer
        .placements
        .iter()
        .map(|p| {
            Value::object([
                ("profile", Value::string(&p.profile)),
                ("profile_id", Value::Number(p.profile_id.into())),
                ("start", Value::Number(p.start.into())),
                ("size", Value::Number(p.size.into())),
            ])
        })
        .collect();
    let suggestions = answer.suggestions.iter().map(Value::string).collect();
    let mut state = config.clone();
    state.set("id", Value::String(layout_id(gpu_type, layout)));
    state.set("fits", Value::Bool(answer.fits));
    state.set("placements", Value::List(placements));
    state.set("reason", Value::string(&answer.reason));
    state.set("suggestions", Value::List(suggestions));
    state
}

#[async_trait]
impl DataSourceType for MigLayout {
    fn name(&self) -> &'static str {
        "mig_layout"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "Whether a per-GPU MIG layout fits a GPU model, and how; creates nothing.",
            vec![
                Attribute::computed(
                    "id",
                    Type::String,
                    "The model and the layout, e.g. `H100-80GB:1g.10gb=2,3g.40gb=1`.",
                ),
                Attribute::required(
                    "gpu_type",
                    Type::String,
                    "GPU model, e.g. `H100-80GB`; an unknown model or one without MIG is an error.",
                ),
                Attribute::required(
                    "layout",
                    Type::map(Type::Number),
                    "Per-GPU layout: MIG profile name to instance count (at least 0).",
                ),
                Attribute::computed(
                    "fits",
                    Type::Bool,
                    "Whether the layout can be placed on one GPU of the model.",
                ),
                Attribute::computed(
                    "placements",
                    Type::list(placement_type()),
                    "Where each instance goes on the GPU, in the order they are created (larger first); empty when it does not fit.",
                ),
                Attribute::computed(
                    "reason",
                    Type::String,
                    "Which rule the layout breaks; empty when it fits.",
                ),
                Attribute::computed(
                    "suggestions",
                    Type::list(Type::String),
                    "The nearest valid layouts when it does not fit, e.g. `{\"3g.40gb\" = 2}`; empty when it fits.",
                ),
            ],
        )
    }

    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        count_errors(config).into_result()
    }

    async fn read(&self, config: &Value) -> Result<Value, Diagnostics> {
        // Counts unknown at validation are known now.
        count_errors(config).into_result()?;
        let client = self.provider.client()?;
        let gpu_type = required_arg(config, "gpu_type")?;
        let layout = config
            .number_map_attr("layout")
            .map_err(Diagnostics::from)?
            .unwrap_or_default();
        let request = api::CheckMigLayoutRequest {
            gpu_type: gpu_type.clone(),
            layout: request_layout(&layout),
        };
        let answer = client
            .fleet()
            .check_mig_layout(request)
            .await
            .map_err(|s| {
                Diagnostics::from(model_refusal(&s).unwrap_or_else(|| client.diagnostic(&s)))
            })?
            .into_inner();
        Ok(answer_state(config, &gpu_type, &layout, &answer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout_value(entries: &[(&str, i64)]) -> Value {
        Value::Map(
            entries
                .iter()
                .map(|(p, c)| (p.to_string(), Value::Number(*c)))
                .collect(),
        )
    }

    fn config(entries: &[(&str, i64)]) -> Value {
        Value::object([
            ("id", Value::Null),
            ("gpu_type", Value::string("H100-80GB")),
            ("layout", layout_value(entries)),
            ("fits", Value::Null),
            ("placements", Value::Null),
            ("reason", Value::Null),
            ("suggestions", Value::Null),
        ])
    }

    fn layout_of(entries: &[(&str, i64)]) -> BTreeMap<String, i64> {
        entries.iter().map(|(p, c)| (p.to_string(), *c)).collect()
    }

    #[test]
    fn schema_has_every_attribute_with_its_mode() {
        use crate::framework::Mode;
        let schema = MigLayout::new(Arc::new(ProviderState::default())).schema();
        let modes: Vec<(&str, Mode)> = schema.attributes.iter().map(|a| (a.name, a.mode)).collect();
        assert_eq!(
            modes,
            vec![
                ("id", Mode::Computed),
                ("gpu_type", Mode::Required),
                ("layout", Mode::Required),
                ("fits", Mode::Computed),
                ("placements", Mode::Computed),
                ("reason", Mode::Computed),
                ("suggestions", Mode::Computed),
            ]
        );
    }

    #[tokio::test]
    async fn negative_counts_are_refused_on_their_key() {
        let ds = MigLayout::new(Arc::new(ProviderState::default()));
        let err = ds
            .validate(&config(&[("1g.10gb", -1), ("3g.40gb", 0), ("2g.20gb", -2)]))
            .await
            .unwrap_err();
        let found: Vec<(Option<AttrPath>, String)> =
            err.0.into_iter().map(|d| (d.path, d.summary)).collect();
        assert_eq!(
            found,
            vec![
                (
                    Some(AttrPath::attr("layout").key("1g.10gb")),
                    "layout[\"1g.10gb\"]: must be at least 0 (got -1)".to_string()
                ),
                (
                    Some(AttrPath::attr("layout").key("2g.20gb")),
                    "layout[\"2g.20gb\"]: must be at least 0 (got -2)".to_string()
                ),
            ]
        );
    }

    #[tokio::test]
    async fn zero_and_unknown_counts_pass_validation() {
        let ds = MigLayout::new(Arc::new(ProviderState::default()));
        ds.validate(&config(&[("3g.40gb", 0), ("1g.10gb", 2)]))
            .await
            .unwrap();
        let mut unknown = config(&[]);
        unknown.set("layout", Value::Unknown);
        ds.validate(&unknown).await.unwrap();
    }

    #[test]
    fn id_names_the_model_and_the_layout_in_profile_order() {
        let layout = layout_of(&[("3g.40gb", 1), ("1g.10gb", 2), ("2g.20gb", 1)]);
        assert_eq!(
            layout_id("H100-80GB", &layout),
            "H100-80GB:1g.10gb=2,2g.20gb=1,3g.40gb=1"
        );
        assert_eq!(layout_id("A100-80GB", &BTreeMap::new()), "A100-80GB:");
    }

    #[test]
    fn counts_beyond_i32_are_clamped_not_wrapped() {
        let layout = layout_of(&[("1g.10gb", i64::from(i32::MAX) + 1), ("2g.20gb", 3)]);
        let request = request_layout(&layout);
        assert_eq!(request["1g.10gb"], i32::MAX);
        assert_eq!(request["2g.20gb"], 3);
    }

    #[test]
    fn a_fitting_layout_keeps_the_planner_order_and_an_empty_reason() {
        let entries = [("3g.40gb", 1), ("1g.10gb", 1)];
        let answer = api::CheckMigLayoutResponse {
            fits: true,
            placements: vec![
                api::MigPlacement {
                    profile: "3g.40gb".into(),
                    profile_id: 9,
                    start: 0,
                    size: 4,
                },
                api::MigPlacement {
                    profile: "1g.10gb".into(),
                    profile_id: 19,
                    start: 4,
                    size: 1,
                },
            ],
            ..Default::default()
        };
        let state = answer_state(
            &config(&entries),
            "H100-80GB",
            &layout_of(&entries),
            &answer,
        );
        assert_eq!(state.get("fits"), &Value::Bool(true));
        assert_eq!(state.get("reason"), &Value::string(""));
        assert_eq!(state.get("suggestions"), &Value::List(vec![]));
        assert_eq!(state.get("layout"), &layout_value(&entries));
        assert_eq!(
            state.get("placements"),
            &Value::List(vec![
                Value::object([
                    ("profile", Value::string("3g.40gb")),
                    ("profile_id", Value::Number(9)),
                    ("start", Value::Number(0)),
                    ("size", Value::Number(4)),
                ]),
                Value::object([
                    ("profile", Value::string("1g.10gb")),
                    ("profile_id", Value::Number(19)),
                    ("start", Value::Number(4)),
                    ("size", Value::Number(1)),
                ]),
            ])
        );
        assert_eq!(
            state.get("id"),
            &Value::string("H100-80GB:1g.10gb=1,3g.40gb=1")
        );
    }

    #[test]
    fn a_layout_that_does_not_fit_is_an_answer_with_the_rule_and_suggestions() {
        let entries = [("3g.40gb", 3)];
        let answer = api::CheckMigLayoutResponse {
            fits: false,
            reason: "the instances need 12 memory slices; a GPU has 8".into(),
            suggestions: vec!["{\"3g.40gb\" = 2}".into()],
            ..Default::default()
        };
        let state = answer_state(
            &config(&entries),
            "H100-80GB",
            &layout_of(&entries),
            &answer,
        );
        assert_eq!(state.get("fits"), &Value::Bool(false));
        assert_eq!(
            state.get("reason"),
            &Value::string("the instances need 12 memory slices; a GPU has 8")
        );
        assert_eq!(
            state.get("suggestions"),
            &Value::List(vec![Value::string("{\"3g.40gb\" = 2}")])
        );
        assert_eq!(state.get("placements"), &Value::List(vec![]));
    }

    #[test]
    fn a_model_without_mig_is_an_error_on_gpu_type() {
        let status = crate::resources::checks::as_sent(
            Code::InvalidArgument,
            "mig_layout: L40S does not support MIG; leave mig_layout unset to use whole GPUs",
        );
        let d = model_refusal(&status).unwrap();
        assert_eq!(d.path, Some(AttrPath::attr("gpu_type")));
        assert_eq!(
            d.summary,
            "gpu_type: L40S does not support MIG; leave mig_layout unset to use whole GPUs"
        );
    }

    #[test]
    fn an_unknown_model_is_an_error_on_gpu_type_named_once() {
        let status = crate::resources::checks::as_sent(
            Code::InvalidArgument,
            "gpu_type: unknown GPU model 'H900' (known: A100-80GB, H100-80GB)",
        );
        let d = model_refusal(&status).unwrap();
        assert_eq!(d.path, Some(AttrPath::attr("gpu_type")));
        assert_eq!(
            d.summary,
            "gpu_type: unknown GPU model 'H900' (known: A100-80GB, H100-80GB)"
        );
    }

    #[test]
    fn other_refusals_are_left_to_the_client_diagnostic() {
        for status in [
            Status::permission_denied("tenant tokens may not do this"),
            Status::unavailable("backend stopping"),
        ] {
            assert_eq!(model_refusal(&status), None, "{status:?}");
        }
    }
}
