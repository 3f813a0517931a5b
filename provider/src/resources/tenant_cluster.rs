//! `gpufleet_tenant_cluster`: a Kubernetes or Slurm cluster on whole nodes for one tenant,
//! optionally with every GPU partitioned by MIG.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;
use tonic::{Code, Status};

use super::capacity_wait;
use super::checks::{adopt_hint, import_tenant, verdict, written, Asked};
use super::cluster_node::{cluster_node_type, cluster_node_value};
use super::cluster_waits;
use super::common::{
    check_min, compared_prior, diag, found, import_id, imported, imported_tenant, known_gpu_type,
    required_i64, required_str, respelled_prior, with_tenant_spelling, ImportId,
};
use super::node_plan::Count;
use super::waiting::{self, Deadline};
use crate::client::Client;
use crate::framework::{
    changed, default_when_unset, mark_unknown, requires_replace_if_changed, AttrPath, Attribute,
    Diagnostic, Diagnostics, PlannedChange, ResourceType, Schema, Type, Value,
};
use crate::state::ProviderState;
use crate::validation;

pub struct TenantCluster {
    provider: Arc<ProviderState>,
    /// Creates this plan's dry runs found will wait for capacity, for the plan's warnings.
    will_wait: capacity_wait::WillWait,
}

impl TenantCluster {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self {
            provider,
            will_wait: Default::default(),
        }
    }
}

pub const DEFAULT_STORAGE_GIB: i64 = 100;
/// Nodes a rolling driver change takes out of service at once, when not set.
pub const DEFAULT_MAX_UNAVAILABLE: i64 = 1;
/// What deleting a cluster does to its volume when the configuration does not say.
pub const DEFAULT_STORAGE_RETENTION: &str = "delete";
const RETENTIONS: &[&str] = &["delete", "keep"];
const ORCHESTRATORS: &[&str] = &["kubernetes", "slurm"];
const REPLACE_ON: &[&str] = &[
    "tenant",
    "name",
    "orchestrator",
    "gpu_type",
    "reservation_id",
    "preemptible",
    "allow_on_demand",
];
/// Computed attributes set at create.
const COMPUTED: &[&str] = &[
    "id",
    "status",
    "status_reason",
    "nodes",
    "endpoint",
    "credentials",
    "storage_path",
    "storage_used_gib",
    "acceptance_status",
    "acceptance_nodes",
];

/// The cluster's node_count as the state records it: the nodes it holds, when that is
/// fewer than it asked for (failed nodes quarantined with no replacement left), so that
/// the next plan shows the shortfall as a change to apply rather than an empty plan.
fn nodes_in_service(c: &api::TenantCluster) -> i64 {
    c.node_count.min(c.nodes.len() as i64)
}

/// The cluster as the state records it; `nodes` in the order of `order` (the prior or
/// planned list, see [`super::node_plan::in_prior_order`]).
fn state(c: &api::TenantCluster, order: &Value) -> Value {
    let reservation = if c.reservation_id.is_empty() {
        Value::Null
    } else {
        Value::string(&c.reservation_id)
    };
    let layout = c
        .mig_layout
        .iter()
        .map(|(k, v)| (k.clone(), Value::Number((*v).into())))
        .collect();
    Value::object([
        ("id", Value::string(&c.id)),
        ("tenant", Value::string(&c.tenant_id)),
        ("name", Value::string(&c.name)),
        ("orchestrator", Value::string(&c.orchestrator)),
        ("gpu_type", Value::string(&c.gpu_type)),
        ("node_count", Value::Number(nodes_in_service(c))),
        ("reservation_id", reservation),
        ("storage_gib", Value::Number(c.storage_gib)),
        ("mig_layout", Value::Map(layout)),
        ("status", Value::string(&c.status)),
        ("status_reason", Value::string(&c.status_reason)),
        (
            "nodes",
            Value::List(super::node_plan::in_prior_order(
                c.nodes.iter().map(cluster_node_value).collect(),
                order,
            )),
        ),
        ("endpoint", Value::string(&c.endpoint)),
        ("credentials", Value::string(&c.credentials)),
        ("storage_path", Value::string(&c.storage_path)),
        ("storage_used_gib", Value::Number(c.storage_used_gib)),
        (
            "storage_retention",
            Value::string(if c.storage_retention.is_empty() {
                DEFAULT_STORAGE_RETENTION
            } else {
                &c.storage_retention
            }),
        ),
        ("cuda_version", optional_string(&c.cuda_version)),
        ("driver_version", optional_string(&c.driver_version)),
        // 0 is the API's "default", which is 1.
        (
            "max_unavailable",
            Value::Number(i64::from(c.max_unavailable).max(DEFAULT_MAX_UNAVAILABLE)),
        ),
        ("preemptible", Value::Bool(c.preemptible)),
        ("allow_on_demand", Value::Bool(c.allow_on_demand)),
        (
            "ssh_public_keys",
            Value::List(c.ssh_public_keys.iter().map(Value::string).collect()),
        ),
    ])
}

/// A list of strings as the API takes it: empty when null or unknown (unknown elements
/// left out: a plan-time check asks about what is known).
fn string_list(state: &Value, name: &str) -> Vec<String> {
    match state.get(name) {
        Value::List(items) => items
            .iter()
            .filter_map(|v| match v {
                Value::String(s) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Null for the API's empty string ("not asked" / "not known").
fn optional_string(s: &str) -> Value {
    if s.is_empty() {
        Value::Null
    } else {
        Value::string(s)
    }
}

/// The plan without backend checks (and without asking the backend for the driver).
#[cfg(test)]
pub fn plan(prior: Option<&Value>, proposed: Value, config: &Value) -> PlannedChange {
    let mut planned = plan_inputs(prior, proposed, config);
    mark_effects(prior, &mut planned.state);
    planned
}

/// The planned inputs: defaults, replacement, and a `driver_version` that is unknown
/// where the backend chooses it (see [`driver_question`]); not yet what they change.
fn plan_inputs(prior: Option<&Value>, proposed: Value, config: &Value) -> PlannedChange {
    let mut planned = proposed;
    default_when_unset(
        &mut planned,
        config,
        "storage_gib",
        Value::Number(DEFAULT_STORAGE_GIB),
    );
    default_when_unset(
        &mut planned,
        config,
        "mig_layout",
        Value::Map(BTreeMap::new()),
    );
    default_when_unset(
        &mut planned,
        config,
        "max_unavailable",
        Value::Number(DEFAULT_MAX_UNAVAILABLE),
    );
    default_when_unset(
        &mut planned,
        config,
        "storage_retention",
        Value::string(DEFAULT_STORAGE_RETENTION),
    );
    default_when_unset(&mut planned, config, "preemptible", Value::Bool(false));
    default_when_unset(&mut planned, config, "allow_on_demand", Value::Bool(false));
    default_when_unset(
        &mut planned,
        config,
        "ssh_public_keys",
        Value::List(Vec::new()),
    );
    let driver_unset = config.get("driver_version").is_null();
    let Some(prior) = prior else {
        mark_unknown(&mut planned, COMPUTED);
        // Without an exact driver it is the one ResolveDriver picks for cuda_version
        // (filled in at plan time when the backend can be asked), or the nodes' own.
        if driver_unset {
            mark_unknown(&mut planned, &["driver_version"]);
        }
        return PlannedChange {
            state: planned,
            requires_replace: vec![],
        };
    };
    // Without an exact driver the proposed value is the prior one (the nodes' driver),
    // which stays unless cuda_version changes to a value, which picks the driver anew. A
    // state written before driver_version existed reads it back at apply.
    let cuda_picks =
        !config.get("cuda_version").is_null() && changed(prior, &planned, "cuda_version");
    if driver_unset && (cuda_picks || prior.get("driver_version").is_null()) {
        mark_unknown(&mut planned, &["driver_version"]);
    }
    let requires_replace = requires_replace_if_changed(prior, &planned, REPLACE_ON);
    PlannedChange {
        state: planned,
        requires_replace,
    }
}

/// Marks what the planned inputs change on an existing cluster as unknown: of its nodes,
/// what a new node count, layout or driver rewrites (see [`super::node_plan`]); its status
/// when those or the volume change.
fn mark_effects(prior: Option<&Value>, planned: &mut Value) {
    let Some(prior) = prior else {
        return;
    };
    // Any change is applied, and the answer reads the volume's use afresh.
    if prior != planned {
        mark_unknown(planned, &["storage_used_gib"]);
    }
    // A state from before driver_version existed reads it back without changing a node.
    let new_driver =
        !prior.get("driver_version").is_null() && changed(prior, planned, "driver_version");
    let driver = planned.get("driver_version").clone();
    let count = match (prior.i64_attr("node_count"), planned.i64_attr("node_count")) {
        (Ok(Some(was)), Ok(Some(now))) if now == was => Count::Same,
        (Ok(Some(was)), Ok(Some(now))) if now < was => {
            Count::Shrink(usize::try_from(now).unwrap_or(0))
        }
        (Ok(Some(_)), Ok(Some(now))) => Count::Grow(usize::try_from(now).unwrap_or(0)),
        _ if !changed(prior, planned, "node_count") => Count::Same,
        _ => Count::Other,
    };
    let layout = planned.get("mig_layout").clone();
    let change = super::node_plan::NodeChange {
        count,
        driver: new_driver.then_some(&driver),
        layout: changed(prior, planned, "mig_layout").then_some(&layout),
    };
    if change.any() {
        let nodes = super::node_plan::planned_nodes(prior.get("nodes"), change);
        planned.set("nodes", nodes);
    }
    if change.any() || changed(prior, planned, "storage_gib") {
        mark_unknown(planned, &["status", "status_reason"]);
    }
}

/// A cluster the backend was still changing when the state was read (an apply that
/// timed out): the plan updates it, and the update waits for the change to settle.
fn mark_unsettled(prior: Option<&Value>, planned: &mut Value) {
    let Some(prior) = prior else {
        return;
    };
    if let Ok(Some(status)) = prior.str_attr("status") {
        if ["creating", "updating"].contains(&status) {
            mark_unknown(planned, &["status", "status_reason", "nodes"]);
        }
    }
}

/// What to ask ResolveDriver at plan time, if anything: when the configuration names a
/// CUDA version or a driver and (on create, or when either changes) everything the
/// answer depends on is known. Values known only at apply are left to the backend then.
pub fn driver_question(
    prior: Option<&Value>,
    planned: &Value,
    config: &Value,
) -> Result<Option<api::ResolveDriverRequest>, Diagnostic> {
    let cuda = config.get("cuda_version");
    let driver = config.get("driver_version");
    if cuda.is_null() && driver.is_null() {
        return Ok(None);
    }
    let changes = |name: &str| prior.is_none_or(|p| changed(p, planned, name));
    let asked_anew = changes("cuda_version") || (!driver.is_null() && changes("driver_version"));
    if !asked_anew
        || cuda.is_unknown()
        || driver.is_unknown()
        || planned.get("gpu_type").is_unknown()
        || !planned.get("mig_layout").is_fully_known()
    {
        return Ok(None);
    }
    let Some(gpu_type) = planned.str_attr("gpu_type")? else {
        return Ok(None);
    };
    let mig = planned
        .number_map_attr("mig_layout")?
        .is_some_and(|layout| !layout.is_empty());
    Ok(Some(api::ResolveDriverRequest {
        gpu_type: gpu_type.to_string(),
        cuda_version: config
            .str_attr("cuda_version")?
            .unwrap_or_default()
            .to_string(),
        driver_version: config
            .str_attr("driver_version")?
            .unwrap_or_default()
            .to_string(),
        mig,
    }))
}

/// Takes ResolveDriver's answer into the plan: the chosen driver becomes the planned
/// `driver_version` where the configuration leaves it to the backend; a refusal becomes
/// an error on the attribute it names. `describe` words any other failure.
pub fn settle_driver(
    planned: &mut Value,
    config: &Value,
    answer: Result<api::ResolveDriverResponse, Status>,
    describe: impl Fn(&Status) -> Diagnostic,
) -> Result<(), Diagnostic> {
    let blamed = if config.get("driver_version").is_null() {
        "cuda_version"
    } else {
        "driver_version"
    };
    let answer = answer.map_err(|status| {
        if status.code() == Code::Unimplemented {
            return Diagnostic::error_at(
                AttrPath::attr(blamed),
                format!("{blamed}: this gpufleet backend cannot choose drivers (ResolveDriver is not implemented)"),
                "Upgrade gpufleet-agent, or leave cuda_version and driver_version out to keep the nodes' driver.",
            );
        }
        driver_refusal(&status, blamed)
            .unwrap_or_else(|| describe(&status).at(AttrPath::attr(blamed)))
    })?;
    let Some(driver) = answer.driver.filter(|d| !d.version.is_empty()) else {
        return Err(Diagnostic::error_at(
            AttrPath::attr(blamed),
            format!("{blamed}: the backend chose no driver"),
            "ResolveDriver answered without a driver version; this is a backend bug.",
        ));
    };
    if config.get("driver_version").is_null() {
        planned.set("driver_version", Value::string(driver.version));
    }
    Ok(())
}

/// Attributes a ResolveDriver refusal may name at the start of its message.
const DRIVER_FIELDS: &[&str] = &["cuda_version", "driver_version", "gpu_type", "mig_layout"];

/// The backend's refusal of a driver choice (INVALID_ARGUMENT; its details name the
/// attribute it is about, e.g. `driver_version` for `driver_version: 535.54.03 is too old
/// for CUDA 12.4, which needs at least 550.54.14`), said on that attribute; one naming
/// none of them is said on `default`.
pub fn driver_refusal(status: &Status, default: &str) -> Option<Diagnostic> {
    if status.code() != Code::InvalidArgument {
        return None;
    }
    super::checks::refusal(status, DRIVER_FIELDS, default)
}

/// Checks a version attribute of the configuration: not empty (leave it out instead),
/// digits and dots like `example`.
fn check_version(config: &Value, name: &str, example: &str, diags: &mut Diagnostics) {
    match config.str_attr(name) {
        Ok(Some(v)) => {
            if let Err(reason) = version_text(v, example) {
                diags.attr_error(name, reason);
            }
        }
        Ok(None) => {}
        Err(d) => diags.push(d),
    }
}

fn version_text(v: &str, example: &str) -> Result<(), String> {
    if v.is_empty() {
        return Err(format!(
            "must not be empty; leave it out instead (e.g. {example:?})"
        ));
    }
    let well_formed = v
        .split('.')
        .all(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_digit()));
    if !well_formed || v.len() > 32 {
        return Err(format!("{v:?} is not a version such as {example:?}"));
    }
    Ok(())
}

/// The refusal for a MIG layout the backend's planner cannot place.
pub fn mig_error(answer: &api::CheckMigLayoutResponse) -> Option<Diagnostic> {
    (!answer.fits).then(|| {
        let detail = if answer.suggestions.is_empty() {
            String::new()
        } else {
            format!("Nearest valid layouts: {}", answer.suggestions.join(", "))
        };
        Diagnostic::error_at(
            AttrPath::attr("mig_layout"),
            // The planner's reason may name the attribute already.
            format!(
                "mig_layout: {}",
                answer
                    .reason
                    .strip_prefix("mig_layout: ")
                    .unwrap_or(&answer.reason)
            ),
            detail,
        )
    })
}

/// The warning for an in-place `mig_layout` change that drops profiles the cluster has
/// now: work that asks for them (a Slurm job's `--gres=gpu:PROFILE:N`) is not refused by
/// the scheduler, it stays pending for ever, and nothing else says so.
pub fn removed_profiles_warning(prior: &Value, planned: &Value) -> Option<Diagnostic> {
    if !planned.get("mig_layout").is_fully_known() {
        return None;
    }
    let layout = |v: &Value| {
        v.number_map_attr("mig_layout")
            .ok()
            .flatten()
            .unwrap_or_default()
    };
    let (before, after) = (layout(prior), layout(planned));
    let removed: Vec<String> = before
        .keys()
        .filter(|p| !after.contains_key(*p))
        .map(|p| format!("{p:?}"))
        .collect();
    if removed.is_empty() {
        return None;
    }
    let (profiles, them) = match removed.len() {
        1 => ("profile", "it"),
        _ => ("profiles", "them"),
    };
    let asks = if planned.str_attr("orchestrator").ok().flatten() == Some("slurm") {
        format!(
            "Slurm jobs that ask for {them} (e.g. `--gres=gpu:{}:1`)",
            removed[0].trim_matches('"')
        )
    } else {
        format!("Workloads that ask for {them}")
    };
    Some(Diagnostic::warning_at(
        AttrPath::attr("mig_layout"),
        format!(
            "mig_layout: the new layout removes {profiles} {}; work asking for {them} will stay pending",
            removed.join(", ")
        ),
        format!("{asks}, queued now or submitted later, wait for ever: no GPU of the cluster will offer {them}. Cancel or resubmit them with a profile the new layout has."),
    ))
}

/// Adds the planner's refusal of a known, non-empty `mig_layout`.
async fn check_layout(
    client: &Client,
    gpu_type: &str,
    planned: &Value,
    diags: &mut Diagnostics,
) -> Result<(), Diagnostics> {
    if !planned.get("mig_layout").is_fully_known() {
        return Ok(());
    }
    let layout = planned
        .number_map_attr("mig_layout")
        .map_err(diag)?
        .unwrap_or_default();
    if layout.is_empty() {
        return Ok(());
    }
    let request = api::CheckMigLayoutRequest {
        gpu_type: gpu_type.to_string(),
        layout: layout_i32(&layout),
    };
    match client.fleet().check_mig_layout(request).await {
        Ok(answer) => {
            if let Some(d) = mig_error(&answer.into_inner()) {
                diags.push(d);
            }
        }
        Err(s) => diags.push(client.diagnostic(&s).at(AttrPath::attr("mig_layout"))),
    }
    Ok(())
}

/// Inputs of a create or update that must be known for a dry run (a tenant or a
/// reservation made by the same apply is not, and the backend decides at apply).
const DRY_RUN_INPUTS: &[&str] = &[
    "wait_for_capacity",
    "tenant",
    "name",
    "orchestrator",
    "gpu_type",
    "node_count",
    "reservation_id",
    "storage_gib",
    "storage_retention",
    "mig_layout",
    "cuda_version",
    "max_unavailable",
    "preemptible",
    "allow_on_demand",
];

/// Attributes an update sends; a dry-run update asks only when one of them changes.
const UPDATED: &[&str] = &[
    "node_count",
    "storage_gib",
    "storage_retention",
    "mig_layout",
    "cuda_version",
    "driver_version",
    "max_unavailable",
];

/// The create call for a planned cluster.
fn create_request(
    planned: &Value,
    config: &Value,
) -> Result<api::CreateTenantClusterRequest, Diagnostics> {
    let layout = planned
        .number_map_attr("mig_layout")
        .map_err(diag)?
        .unwrap_or_default();
    let mut request = api::CreateTenantClusterRequest {
        request_id: String::new(),
        tenant_id: super::common::optional_tenant(planned)?,
        name: required_str(planned, "name")?,
        orchestrator: required_str(planned, "orchestrator")?,
        gpu_type: required_str(planned, "gpu_type")?,
        node_count: required_i64(planned, "node_count")?,
        reservation_id: optional_str(planned, "reservation_id")?,
        storage_gib: required_i64(planned, "storage_gib")?,
        storage_retention: optional_str(planned, "storage_retention")?,
        mig_layout: layout_i32(&layout),
        cuda_version: optional_str(planned, "cuda_version")?,
        driver_version: requested_driver(planned, config)?,
        max_unavailable: count_i32(required_i64(planned, "max_unavailable")?),
        validate_only: false,
        preemptible: planned
            .bool_attr("preemptible")
            .map_err(diag)?
            .unwrap_or(false),
        allow_on_demand: planned
            .bool_attr("allow_on_demand")
            .map_err(diag)?
            .unwrap_or(false),
        ssh_public_keys: string_list(planned, "ssh_public_keys"),
        wait_seconds: capacity_wait::requested(planned)?,
        ..super::acceptance::create_fields(planned)?
    };
    request.request_id = create_key(&request);
    Ok(request)
}

/// The request id of a create: the same for the same cluster and configuration, so that
/// an apply after one that timed out gets the cluster the first one started (the backend
/// answers a known request id with its cluster, as it is) instead of a second one or a
/// "name already exists". Keyed to the working directory and workspace too: another
/// configuration (or workspace) with the same text is another state, whose create of a
/// taken name is a duplicate to refuse, not this one's retry.
fn create_key(r: &api::CreateTenantClusterRequest) -> String {
    use sha2::{Digest, Sha256};
    // Every field the request carries (so every one the backend's fingerprint may hold),
    // the layout in a stable order.
    let fields = api::CreateTenantClusterRequest {
        request_id: String::new(),
        validate_only: false,
        mig_layout: HashMap::new(),
        ..r.clone()
    };
    let layout: BTreeMap<&String, &i32> = r.mig_layout.iter().collect();
    let text = format!("{fields:?} {layout:?} {:?}", state_home());
    let digest = hex::encode(Sha256::digest(text.as_bytes()));
    format!("tf-{}", &digest[..32])
}

/// Where this run's state lives, as far as a provider can tell: a remote backend's settings
/// (the same state from any checkout, e.g. a CI runner's), else the working directory
/// Terraform starts it in; and the workspace, `TF_WORKSPACE` or the one `.terraform` selects.
fn state_home() -> (String, String) {
    let data_dir = std::path::PathBuf::from(
        std::env::var_os("TF_DATA_DIR").unwrap_or_else(|| ".terraform".into()),
    );
    let read = |name: &str| std::fs::read_to_string(data_dir.join(name)).ok();
    let remote = read("terraform.tfstate")
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .map(|s| s["backend"].clone())
        .filter(|b| !b["type"].is_null() && b["type"] != "local")
        .map(|b| format!("{} {}", b["type"], b["config"]));
    let home = remote.unwrap_or_else(|| {
        let dir = std::env::current_dir().unwrap_or_default();
        dir.display().to_string()
    });
    let workspace = std::env::var("TF_WORKSPACE")
        .ok()
        .or_else(|| read("environment"))
        .unwrap_or_default();
    (home, workspace.trim().to_string())
}

/// The update call taking a cluster from `prior` to `planned`: the MIG layout and the
/// driver only when they change (each has its `set_` flag), `max_unavailable` only when it
/// changes (0 leaves it).
fn update_request(
    prior: &Value,
    planned: &Value,
    config: &Value,
) -> Result<api::UpdateTenantClusterRequest, Diagnostics> {
    let layout = planned
        .number_map_attr("mig_layout")
        .map_err(diag)?
        .unwrap_or_default();
    // A new CUDA version or driver rolls through the nodes; taking both out (null) keeps
    // the nodes' driver and forgets the CUDA version.
    let set_driver =
        changed(prior, planned, "cuda_version") || changed(prior, planned, "driver_version");
    let (cuda_version, driver_version) = if set_driver {
        (
            optional_str(planned, "cuda_version")?,
            requested_driver(planned, config)?,
        )
    } else {
        (String::new(), String::new())
    };
    let max_unavailable = if changed(prior, planned, "max_unavailable") {
        count_i32(required_i64(planned, "max_unavailable")?)
    } else {
        0
    };
    Ok(api::UpdateTenantClusterRequest {
        id: required_str(prior, "id")?,
        node_count: required_i64(planned, "node_count")?,
        storage_gib: required_i64(planned, "storage_gib")?,
        mig_layout: layout_i32(&layout),
        set_mig_layout: changed(prior, planned, "mig_layout"),
        set_driver,
        cuda_version,
        driver_version,
        max_unavailable,
        validate_only: false,
        set_ssh_public_keys: changed(prior, planned, "ssh_public_keys"),
        ssh_public_keys: string_list(planned, "ssh_public_keys"),
        storage_retention: if changed(prior, planned, "storage_retention") {
            optional_str(planned, "storage_retention")?
        } else {
            String::new()
        },
        ..super::acceptance::update_fields(prior, planned)?
    })
}

/// A string attribute as the API takes it: empty when null or unknown.
fn optional_str(state: &Value, name: &str) -> Result<String, Diagnostics> {
    Ok(state
        .str_attr(name)
        .map_err(diag)?
        .unwrap_or_default()
        .to_string())
}

/// The driver to ask the backend for: the planned one when known (the configuration's,
/// or the one ResolveDriver chose at plan time for `cuda_version`, so the apply installs
/// what the plan showed), otherwise none: the backend chooses, or keeps the nodes' own
/// when the configuration asks for neither.
fn requested_driver(planned: &Value, config: &Value) -> Result<String, Diagnostics> {
    // Neither asked: keep the nodes' driver, even one the platform no longer offers.
    if config.get("cuda_version").is_null() && config.get("driver_version").is_null() {
        return Ok(String::new());
    }
    optional_str(planned, "driver_version")
}

/// A count as the API takes it (validation keeps it at least 1; beyond i32 it is clamped).
fn count_i32(n: i64) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn layout_i32(layout: &BTreeMap<String, i64>) -> HashMap<String, i32> {
    layout
        .iter()
        .map(|(k, v)| (k.clone(), i32::try_from(*v).unwrap_or(i32::MAX)))
        .collect()
}

impl TenantCluster {
    /// Plan-time admission: the backend's dry run (`validate_only`) of the create or
    /// update this plan applies, after the MIG planner's check of a changed layout (whose
    /// refusal lists the nearest valid layouts). Runs on create, and on an update only
    /// when an attribute the update sends changes, so an unchanged configuration never
    /// calls the backend here and `terraform destroy` (whose pre-destroy plan runs in
    /// normal mode) cannot be blocked by it. The replace half of a replacement is not
    /// dry-run; Terraform plans its create half as a create (without a prior state).
    async fn check_with_backend(
        &self,
        prior: Option<&Value>,
        planned: &PlannedChange,
        config: &Value,
    ) -> Result<(), Diagnostics> {
        // A destroy creates nothing (see `destroy_run`).
        if prior.is_none() && super::destroy_run::destroying() {
            return Ok(());
        }
        let replacing = !planned.requires_replace.is_empty();
        let compared = compared_prior(prior, planned);
        let state = &planned.state;
        let changes = |name: &str| compared.is_none_or(|p| changed(p, state, name));
        if !UPDATED.iter().any(|name| changes(name)) {
            return Ok(());
        }
        let Some(client) = self.provider.plan_client() else {
            return Ok(());
        };
        let Some(gpu_type) = state.str_attr("gpu_type").map_err(diag)? else {
            return Ok(());
        };
        known_gpu_type(&client, gpu_type).await?;
        if changes("mig_layout") {
            let mut diags = Diagnostics::default();
            check_layout(&client, gpu_type, state, &mut diags).await?;
            diags.into_result()?;
        }
        let known = DRY_RUN_INPUTS
            .iter()
            .all(|name| state.get(name).is_fully_known());
        if !known || (prior.is_some() && replacing) {
            return Ok(());
        }
        let answer = match prior {
            None => {
                let request = api::CreateTenantClusterRequest {
                    validate_only: true,
                    planned_quotas: self.planned_quotas(gpu_type),
                    ..create_request(state, config)?
                };
                // The create half of a replacement is planned while the cluster it
                // replaces still holds the name: `verdict` knows that one is in state.
                client.clusters().create_tenant_cluster(request).await
            }
            Some(prior) => {
                let request = api::UpdateTenantClusterRequest {
                    validate_only: true,
                    planned_quotas: self.planned_quotas(gpu_type),
                    ..update_request(prior, state, config)?
                };
                client.clusters().update_tenant_cluster(request).await
            }
        };
        let tenant = super::common::optional_tenant(state)?;
        if let Ok(queued) = &answer {
            let queued = queued.get_ref();
            if prior.is_none() && queued.status == capacity_wait::QUEUED {
                let name = required_str(state, "name")?;
                self.will_wait.note(&tenant, &name, &queued.status_reason);
            }
        }
        let taken = prior.is_none() && matches!(&answer, Err(s) if s.code() == Code::AlreadyExists);
        let asked = Asked {
            tenant: &tenant,
            gpu_type: Some(gpu_type),
        };
        let said = verdict(
            &client,
            &self.provider.run,
            asked,
            answer,
            &written(&self.schema()),
            "node_count",
        )
        .await;
        match said {
            Err(mut diags) if taken => {
                let id = format!(
                    "{}/{}",
                    import_tenant(&client, &tenant).await,
                    required_str(state, "name")?
                );
                adopt_hint(&mut diags, "name", "gpufleet_tenant_cluster", &id);
                Err(diags)
            }
            said => said,
        }
    }

    /// The quotas of `gpu_type` this plan creates or changes (planned before this cluster:
    /// those it depends on), for its dry run to count as they will be.
    fn planned_quotas(&self, gpu_type: &str) -> Vec<api::PlannedQuota> {
        self.provider.run.planned_quotas(gpu_type, "", 100).1
    }

    /// At apply, waits for the create or raise of the quota of `gpu_type` of the tenant
    /// written `tenant` that this run applies (the plan counted it; without a `depends_on`
    /// Terraform applies them in no order).
    async fn after_quota_raise(&self, tenant: &str, gpu_type: &str) {
        let raise = crate::this_run::QuotaChange::Raise;
        let limit = std::time::Duration::from_secs(120);
        let run = &self.provider.run;
        run.quota_changes_applied(gpu_type, tenant, raise, limit)
            .await;
    }

    /// Asks the backend for the driver this plan gives the cluster, when
    /// [`driver_question`] says so and the provider's configuration is known.
    async fn resolve_driver(
        &self,
        prior: Option<&Value>,
        planned: &mut Value,
        config: &Value,
    ) -> Result<(), Diagnostic> {
        let Some(request) = driver_question(prior, planned, config)? else {
            return Ok(());
        };
        let Some(client) = self.provider.plan_client() else {
            return Ok(());
        };
        let answer = client
            .fleet()
            .resolve_driver(request)
            .await
            .map(tonic::Response::into_inner);
        settle_driver(planned, config, answer, |s| client.diagnostic(s))
    }

    /// The cluster `name` of the tenant spelled `tenant`, with every node (a tenant this
    /// token may not see is an error that lists those it may).
    async fn named(
        &self,
        client: &Client,
        tenant: &str,
        name: &str,
    ) -> Result<Option<api::TenantCluster>, Diagnostics> {
        let mut page_token = String::new();
        loop {
            let request = api::ListTenantClustersRequest {
                tenant_id: tenant.to_string(),
                page_size: 0,
                page_token,
            };
            let page = super::common::answered(
                client,
                client.clusters().list_tenant_clusters(request).await,
            )?;
            if let Some(c) = page.clusters.into_iter().find(|c| c.name == name) {
                return self.get(client, c.id).await;
            }
            if page.next_page_token.is_empty() {
                return Ok(None);
            }
            page_token = page.next_page_token;
        }
    }

    async fn get(
        &self,
        client: &Client,
        id: String,
    ) -> Result<Option<api::TenantCluster>, Diagnostics> {
        let request = api::GetTenantClusterRequest { id };
        match found(client, client.clusters().get_tenant_cluster(request).await)? {
            Some(c) => Ok(Some(
                client
                    .with_all_nodes(c)
                    .await
                    .map_err(|s| diag(client.diagnostic(&s)))?,
            )),
            None => Ok(None),
        }
    }
}

/// State after a create or update: the backend's answer with every node (beyond the
/// answer's first page), the tenant as the configuration spells it, and the configured
/// `timeouts` and `acceptance` settings.
async fn answered_state(
    client: &Client,
    answer: api::TenantCluster,
    planned: &Value,
) -> Result<Value, Diagnostics> {
    let c = client
        .with_all_nodes(answer)
        .await
        .map_err(|s| diag(client.diagnostic(&s)))?;
    let mut s = with_tenant_spelling(
        state(&c, planned.get("nodes")),
        planned,
        &c.tenant_id,
        &c.tenant_name,
    );
    s.set("timeouts", waiting::normalized(planned.get("timeouts")));
    s.set(
        capacity_wait::ATTRIBUTE,
        planned.get(capacity_wait::ATTRIBUTE).clone(),
    );
    super::acceptance::set_state(&mut s, &c, planned.get("acceptance"));
    Ok(s)
}

#[async_trait]
impl ResourceType for TenantCluster {
    fn name(&self) -> &'static str {
        "tenant_cluster"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "A Kubernetes or Slurm cluster on whole nodes of one GPU model, for one tenant alone.",
            vec![
                Attribute::computed("id", Type::String, "The cluster's id, assigned by the backend."),
                Attribute::optional_computed("tenant", Type::String, "The tenant, by id or by name (a `gpufleet_tenant`'s `id` or `name`; state keeps what you write). With a tenant token it may be left out: the token's own tenant (a state that names it, as an import by `TENANT/NAME` writes, keeps that spelling). Changing it forces replacement."),
                Attribute::required("name", Type::String, "Cluster name, a DNS label. Changing it forces replacement."),
                Attribute::required("orchestrator", Type::String, "`kubernetes` or `slurm`. Changing it forces replacement."),
                Attribute::required("gpu_type", Type::String, "GPU model, e.g. `H100-80GB`. Changing it forces replacement."),
                Attribute::required("node_count", Type::Number, "Whole nodes, at least 1. Scales in place."),
                Attribute::optional(
                    "reservation_id",
                    Type::String,
                    "Id of an active reservation of the same tenant and model to draw nodes from; without it nodes come from the pool. Changing it forces replacement.",
                ),
                Attribute::optional_computed(
                    "storage_gib",
                    Type::Number,
                    "Size of the cluster's volume in GiB: on the platform's shared storage, a quota of exactly this size (writing past it fails with \"Disk quota exceeded\" for this cluster only); without it, with external node agents, a file system of this size on each node, its own (not shared). Defaults to `100`. Grows in place, online; shrinking is refused at plan time.",
                ),
                Attribute::optional_computed(
                    "storage_retention",
                    Type::String,
                    "What destroying the cluster does to its volume: `delete` (the default) removes it and its data; `keep` leaves it on the shared storage, and a later cluster of the same name in the same tenant attaches it, data included (refused without shared storage on external node agents, where each node's volume goes with it). Changes in place.",
                ),
                Attribute::optional_computed(
                    "mig_layout",
                    Type::map(Type::Number),
                    "Per-GPU MIG layout (profile name to instance count) applied to every GPU. Absent or empty: whole GPUs. Checked at plan time; changes in place.",
                ),
                Attribute::optional(
                    "cuda_version",
                    Type::String,
                    "CUDA version the cluster's workloads need, e.g. `12.4`. Without `driver_version`, the newest offered driver that runs it is chosen at plan time. Changes in place (a rolling driver change).",
                ),
                Attribute::optional_computed(
                    "driver_version",
                    Type::String,
                    "Exact NVIDIA driver for every node, e.g. `550.54.15`; checked at plan time against `cuda_version`, the GPU model and the platform's offer. When unset: the driver chosen for `cuda_version`, or the nodes' current driver. Changes in place, one node at a time.",
                ),
                Attribute::optional_computed(
                    "max_unavailable",
                    Type::Number,
                    "How many nodes a rolling driver change takes out of service at once, at least 1. Defaults to `1`. Changes in place.",
                ),
                Attribute::optional_computed(
                    "preemptible",
                    Type::Bool,
                    "Take pool nodes that are free now even when a reservation holds them later. When that reservation's window starts the platform takes them back: the cluster shrinks (its `node_count`, `status_reason` and events say which nodes left and why), or, with `allow_on_demand`, gets on-demand nodes in their place. Not with `reservation_id`. Defaults to `false`. Changing it forces replacement.",
                ),
                Attribute::optional_computed(
                    "allow_on_demand",
                    Type::Bool,
                    "With `preemptible`: replace pool nodes a reservation takes back by on-demand nodes (when on-demand capacity is free) instead of shrinking. Defaults to `false`. Changing it forces replacement.",
                ),
                capacity_wait::attribute(),
                Attribute::computed("status", Type::String, "`running` once its nodes are assigned and their agents have applied its layout; `degraded` while a node is unreachable (until it is back or replaced); `creating`, `updating` or `deleting` while a change is under way; `queued` while a create with `wait_for_capacity` waits to be admitted, holding nothing (an apply waits through it)."),
                Attribute::computed("status_reason", Type::String, "Why the status is not simply `running` (e.g. which node is unreachable, and whether a replacement is possible); empty otherwise."),
                Attribute::computed(
                    "nodes",
                    Type::list(cluster_node_type()),
                    "The cluster's nodes, their GPUs and each node's MIG instances by profile (`mig_instances`; each GPU's devices are in the `gpufleet_nodes` data source). A node keeps its place in the list while it stays in the cluster; nodes that join are added at the end.",
                ),
                Attribute::optional_computed("ssh_public_keys", Type::list(Type::String), "Slurm only: the OpenSSH public keys (e.g. `file(\"~/.ssh/id_ed25519.pub\")`) that may log in to the cluster's login endpoint as the cluster's own unprivileged account; at most 32. Changes in place (the next login uses them). Default: none, so no one can log in."),
                Attribute::computed("endpoint", Type::String, "Kubernetes API server URL, or the Slurm cluster's login endpoint (its sshd) as host:port."),
                Attribute::computed("credentials", Type::String, "For this cluster alone: a kubeconfig (Kubernetes: the cluster's own CA and a client certificate signed by it), or for Slurm a JSON object saying how to log in: `user`, `host`, `port`, `login` (the ssh command), `known_hosts` (the line that checks the login's host key), `home` and `cluster` (Slurm's ClusterName). It holds no key of the platform.").sensitive(),
                Attribute::computed("storage_path", Type::String, "Where the cluster's nodes see its volume: `/run/gpufleet/volumes/<tenant id>/<cluster name>`, bind-mounted on every node of the cluster from the shared storage, or without it each node's own volume mounted there (with embedded node agents and no shared storage, the volume's own directory). Owned by the cluster's account (Slurm) or root, mode 0700."),
                Attribute::computed("storage_used_gib", Type::Number, "GiB in use on the volume, rounded up, as of the last refresh; with node-local volumes the fullest node's; 0 with embedded node agents and no shared storage."),
            ]
            .into_iter()
            .chain(super::acceptance::attributes())
            .collect(),
        )
        .with_block(waiting::block(&waiting::OPERATIONS))
        .with_block(super::acceptance::block())
    }

    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let mut diags = Diagnostics::default();
        match config.str_attr("name") {
            Ok(Some(name)) => {
                if let Err(reason) = validation::dns_label(name) {
                    diags.attr_error("name", reason);
                }
            }
            Ok(None) => {}
            Err(d) => diags.push(d),
        }
        match config.str_attr("orchestrator") {
            Ok(Some(o)) if !ORCHESTRATORS.contains(&o) => diags.attr_error(
                "orchestrator",
                format!("must be \"kubernetes\" or \"slurm\" (got {o:?})"),
            ),
            Ok(_) => {}
            Err(d) => diags.push(d),
        }
        check_min(config, "node_count", 1, &mut diags);
        match config.str_attr("storage_retention") {
            Ok(Some(r)) if !RETENTIONS.contains(&r) => diags.attr_error(
                "storage_retention",
                format!("must be \"delete\" or \"keep\" (got {r:?})"),
            ),
            Ok(_) => {}
            Err(d) => diags.push(d),
        }
        check_min(config, "storage_gib", 1, &mut diags);
        check_min(config, "max_unavailable", 1, &mut diags);
        check_version(config, "cuda_version", "12.4", &mut diags);
        check_version(config, "driver_version", "550.54.15", &mut diags);
        match config.number_map_attr("mig_layout") {
            Ok(Some(layout)) => {
                for (profile, count) in layout {
                    if count < 1 {
                        diags.push(Diagnostic::error_at(
                            AttrPath::attr("mig_layout").key(&profile),
                            format!("mig_layout[{profile:?}]: must be at least 1 (got {count}); leave the profile out instead"),
                            "",
                        ));
                    } else if let Err(reason) =
                        validation::at_most(count, gpufleet_proto::limits::MAX_MIG_INSTANCES.into())
                    {
                        diags.push(Diagnostic::error_at(
                            AttrPath::attr("mig_layout").key(&profile),
                            format!("mig_layout[{profile:?}]: {reason}"),
                            "",
                        ));
                    }
                }
            }
            Ok(None) => {}
            Err(d) => diags.push(d),
        }
        if let Ok(Some(r)) = config.str_attr("reservation_id") {
            if r.is_empty() {
                diags.attr_error(
                    "reservation_id",
                    "must not be empty; leave it out to take nodes from the pool",
                );
            }
        }
        waiting::check(config, &mut diags);
        capacity_wait::check(config, &mut diags);
        super::acceptance::check(config, &mut diags);
        diags.into_result()
    }

    async fn read(&self, prior: &Value) -> Result<Option<Value>, Diagnostics> {
        let client = self.provider.client()?;
        Ok(self
            .get(&client, required_str(prior, "id")?)
            .await?
            .map(|c| {
                let mut s = with_tenant_spelling(
                    state(&c, prior.get("nodes")),
                    prior,
                    &c.tenant_id,
                    &c.tenant_name,
                );
                s.set("timeouts", waiting::normalized(prior.get("timeouts")));
                s.set(
                    capacity_wait::ATTRIBUTE,
                    prior.get(capacity_wait::ATTRIBUTE).clone(),
                );
                super::acceptance::set_state(&mut s, &c, prior.get("acceptance"));
                s
            }))
    }

    async fn plan(
        &self,
        prior: Option<&Value>,
        proposed: Value,
        config: &Value,
    ) -> Result<PlannedChange, Diagnostics> {
        let mut proposed = proposed;
        super::common::kept_own_tenant(self.provider.plan_client(), config, &mut proposed).await;
        let respelled = respelled_prior(self.provider.plan_client(), prior, &proposed).await;
        let prior = respelled.as_ref().or(prior);
        super::common::note_prior(&self.provider.run, prior);
        let mut planned = plan_inputs(prior, proposed, config);
        let compared = compared_prior(prior, &planned);
        let mut diags = match self.check_with_backend(prior, &planned, config).await {
            Ok(()) => Diagnostics::default(),
            Err(diags) => diags,
        };
        if let Err(d) = self
            .resolve_driver(compared, &mut planned.state, config)
            .await
        {
            // Not twice what the other checks already said (e.g. an unreachable backend).
            let said = diags
                .0
                .iter()
                .any(|e| e.summary == d.summary || (e.path.is_some() && e.path == d.path));
            if !said {
                diags.push(d);
            }
        }
        diags.into_result()?;
        mark_effects(prior, &mut planned.state);
        mark_unsettled(prior, &mut planned.state);
        super::acceptance::mark_plan(prior, &mut planned.state);
        Ok(planned)
    }

    async fn create(&self, planned: &Value, config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let request = create_request(planned, config)?;
        let deadline = Deadline::new("create", waiting::limit(planned, "create")?);
        self.after_quota_raise(&request.tenant_id, &request.gpu_type)
            .await;
        let created = cluster_waits::create(&client, request, deadline).await?;
        answered_state(&client, created, planned).await
    }

    async fn update(
        &self,
        prior: &Value,
        planned: &Value,
        config: &Value,
    ) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let request = update_request(prior, planned, config)?;
        let deadline = Deadline::new("update", waiting::limit(planned, "update")?);
        let tenant = super::common::optional_tenant(planned)?;
        self.after_quota_raise(&tenant, &required_str(planned, "gpu_type")?)
            .await;
        let name = required_str(prior, "name")?;
        let updated = cluster_waits::update(&client, request, name, deadline).await?;
        answered_state(&client, updated, planned).await
    }

    async fn delete(&self, prior: &Value) -> Result<(), Diagnostics> {
        let client = self.provider.client()?;
        let id = required_str(prior, "id")?;
        let name = required_str(prior, "name")?;
        let tenant = super::common::optional_tenant(prior)?;
        let _under_way = self.provider.run.deleting(&[&id, &tenant]);
        let deadline = Deadline::new("delete", waiting::limit(prior, "delete")?);
        cluster_waits::delete(&client, id, name, deadline).await
    }

    async fn plan_delete(&self, prior: &Value) -> Result<(), Diagnostics> {
        // A quota this cluster uses may be deleted by the same plan.
        self.provider.run.plans_delete(&required_str(prior, "id")?);
        Ok(())
    }

    async fn import(&self, id: &str) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let (found, written) = match import_id(id) {
            ImportId::Id(id) => match self.get(&client, id.to_string()).await? {
                Some(c) => (Some(c), None),
                // A tenant token may name its own tenant's cluster alone.
                None => match client.own_tenant().await {
                    Some(own) => (self.named(&client, &own, id).await?, None),
                    None => (None, None),
                },
            },
            ImportId::Named { tenant, name } => {
                (self.named(&client, tenant, name).await?, Some(tenant))
            }
        };
        let found = imported(
            "tenant cluster",
            id,
            "its id or TENANT/NAME (with a tenant token, NAME alone)",
            found,
        )?;
        let mut s = state(&found, &Value::Null);
        s.set(
            "tenant",
            imported_tenant(&client, written, &found.tenant_id).await,
        );
        s.set("timeouts", waiting::normalized(&Value::Null));
        super::acceptance::set_state(&mut s, &found, &Value::Null);
        Ok(s)
    }

    fn plan_warnings(&self, prior: &Value, planned: &Value) -> Diagnostics {
        if prior.is_null() {
            return Diagnostics(self.will_wait.warning(planned).into_iter().collect());
        }
        Diagnostics(
            removed_profiles_warning(prior, planned)
                .into_iter()
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prior() -> Value {
        Value::object([
            ("id", Value::string("c1")),
            ("tenant", Value::string("t1")),
            ("name", Value::string("train")),
            ("orchestrator", Value::string("kubernetes")),
            ("gpu_type", Value::string("A100-80GB")),
            ("node_count", Value::Number(1)),
            ("storage_gib", Value::Number(100)),
            ("mig_layout", Value::Map(BTreeMap::new())),
            ("status", Value::string("running")),
            ("status_reason", Value::string("")),
            ("nodes", Value::List(vec![])),
            ("endpoint", Value::string("https://k")),
            ("credentials", Value::string("kubeconfig")),
            ("storage_path", Value::string("/v")),
            ("storage_used_gib", Value::Number(0)),
            ("storage_retention", Value::string("delete")),
            ("cuda_version", Value::Null),
            ("driver_version", Value::string("550.54.15")),
            ("max_unavailable", Value::Number(1)),
            ("preemptible", Value::Bool(false)),
            ("allow_on_demand", Value::Bool(false)),
            ("ssh_public_keys", Value::List(Vec::new())),
            ("acceptance_status", Value::string("passed")),
            ("acceptance_nodes", Value::List(vec![])),
        ])
    }

    /// The configuration of `state` that leaves the driver to the backend, with
    /// `cuda_version` and `driver_version` as given.
    fn config_with(state: &Value, cuda: Option<&str>, driver: Option<&str>) -> Value {
        let mut c = config_of(state);
        c.set("cuda_version", cuda.map_or(Value::Null, Value::string));
        c.set("driver_version", driver.map_or(Value::Null, Value::string));
        c.set("max_unavailable", Value::Null);
        c
    }

    /// Terraform's proposed new state: the configuration, with the prior value (null on
    /// create) of each computed attribute the configuration leaves null.
    fn proposed(prior: Option<&Value>, config: &Value) -> Value {
        let schema = TenantCluster::new(Arc::new(ProviderState::default())).schema();
        let mut p = config.clone();
        for a in schema.attributes {
            let computed = matches!(
                a.mode,
                crate::framework::Mode::Computed | crate::framework::Mode::OptionalComputed
            );
            if computed && config.get(a.name).is_null() {
                p.set(a.name, prior.map_or(Value::Null, |s| s.get(a.name).clone()));
            }
        }
        p
    }

    fn driver(version: &str) -> api::ResolveDriverResponse {
        api::ResolveDriverResponse {
            driver: Some(api::DriverVersion {
                version: version.into(),
                branch: format!("R{}", &version[..3]),
                cuda_version: "12.4".into(),
                end_of_life: String::new(),
            }),
        }
    }

    /// The resource's plan with ResolveDriver answered by `answer` (and no other backend
    /// check): what it asked, and the plan or the refusal.
    fn plan_asking(
        prior: Option<&Value>,
        config: &Value,
        answer: impl Fn(&api::ResolveDriverRequest) -> Result<api::ResolveDriverResponse, Box<Status>>,
    ) -> (
        Option<api::ResolveDriverRequest>,
        Result<PlannedChange, Diagnostic>,
    ) {
        let mut planned = plan_inputs(prior, proposed(prior, config), config);
        let compared = compared_prior(prior, &planned);
        let question = driver_question(compared, &planned.state, config).unwrap();
        if let Some(q) = &question {
            if let Err(d) =
                settle_driver(&mut planned.state, config, answer(q).map_err(|e| *e), |s| {
                    Diagnostic::error(format!("described: {}", s.message()), "")
                })
            {
                return (question, Err(d));
            }
        }
        mark_effects(prior, &mut planned.state);
        (question, Ok(planned))
    }

    fn never_asked(
        q: &api::ResolveDriverRequest,
    ) -> Result<api::ResolveDriverResponse, Box<Status>> {
        panic!("ResolveDriver asked {q:?}")
    }

    fn config_of(state: &Value) -> Value {
        let mut c = state.clone();
        for name in COMPUTED {
            c.set(name, Value::Null);
        }
        c
    }

    #[test]
    fn create_defaults_storage_and_layout() {
        let cfg = config_of(&prior());
        let mut cfg_without = cfg.clone();
        cfg_without.set("storage_gib", Value::Null);
        cfg_without.set("mig_layout", Value::Null);
        let planned = plan(None, cfg_without.clone(), &cfg_without);
        assert_eq!(planned.state.get("storage_gib"), &Value::Number(100));
        assert_eq!(
            planned.state.get("mig_layout"),
            &Value::Map(BTreeMap::new())
        );
        for name in COMPUTED {
            assert!(planned.state.get(name).is_unknown(), "{name}");
        }
    }

    #[test]
    fn layout_change_is_in_place_and_plans_each_nodes_instances() {
        let mut p = prior();
        p.set("nodes", Value::List(vec![one_node()]));
        let mut proposed = p.clone();
        proposed.set(
            "mig_layout",
            Value::Map(BTreeMap::from([("3g.40gb".to_string(), Value::Number(2))])),
        );
        let planned = plan(Some(&p), proposed.clone(), &config_of(&proposed));
        assert!(planned.requires_replace.is_empty());
        let Value::List(nodes) = planned.state.get("nodes") else {
            panic!("the node stays, planned")
        };
        assert_eq!(nodes[0].get("hostname"), &Value::string("node-1"));
        let Value::List(gpus) = nodes[0].get("gpus") else {
            panic!("its GPUs stay")
        };
        assert_eq!(gpus[0].get("uuid"), &Value::string("GPU-1"));
        assert_eq!(
            nodes[0].get("mig_instances"),
            &Value::Map(BTreeMap::from([("3g.40gb".to_string(), Value::Number(2))]))
        );
        // Only a node count, a driver or the block itself runs checks: the last results stay.
        assert_eq!(planned.state.get("acceptance_nodes"), &Value::List(vec![]));
        assert_eq!(planned.state.get("endpoint"), &Value::string("https://k"));
        assert_eq!(
            planned.state.get("credentials"),
            &Value::string("kubeconfig")
        );
    }

    /// A node of a cluster's state, with one GPU.
    fn one_node() -> Value {
        let gpu = Value::object([
            ("index", Value::Number(0)),
            ("uuid", Value::string("GPU-1")),
        ]);
        Value::object([
            ("hostname", Value::string("node-1")),
            ("mig_instances", Value::Map(BTreeMap::new())),
            ("driver_version", Value::string("550.54.15")),
            ("cuda_version", Value::string("12.4")),
            ("state", Value::string("allocated")),
            ("state_reason", Value::string("")),
            ("gpus", Value::List(vec![gpu])),
        ])
    }

    #[test]
    fn storage_growth_keeps_nodes() {
        let p = prior();
        let mut proposed = p.clone();
        proposed.set("storage_gib", Value::Number(500));
        let planned = plan(Some(&p), proposed.clone(), &config_of(&proposed));
        assert_eq!(planned.state.get("nodes"), &Value::List(vec![]));
    }

    #[test]
    fn storage_retention_changes_in_place_and_any_change_reads_the_use_afresh() {
        let p = prior();
        let mut proposed = p.clone();
        proposed.set("storage_retention", Value::string("keep"));
        let planned = plan(Some(&p), proposed.clone(), &config_of(&proposed));
        assert!(planned.requires_replace.is_empty());
        assert_eq!(planned.state.get("storage_used_gib"), &Value::Unknown);
        // Nothing changed: the use stays as read, and the plan is empty.
        let same = plan(Some(&p), p.clone(), &config_of(&p));
        assert_eq!(same.state, p);
    }

    #[tokio::test]
    async fn storage_retention_is_delete_or_keep() {
        let c = TenantCluster::new(Arc::new(ProviderState::default()));
        let mut cfg = config_of(&prior());
        cfg.set("storage_retention", Value::string("forever"));
        let err = c.validate(&cfg).await.unwrap_err();
        assert_eq!(
            err.0[0].summary,
            "storage_retention: must be \"delete\" or \"keep\" (got \"forever\")"
        );
    }

    #[test]
    fn identity_attributes_force_replacement() {
        let p = prior();
        let mut proposed = p.clone();
        proposed.set("orchestrator", Value::string("slurm"));
        proposed.set("reservation_id", Value::string("r1"));
        let planned = plan(Some(&p), proposed.clone(), &config_of(&proposed));
        assert_eq!(
            planned.requires_replace,
            vec![
                AttrPath::attr("orchestrator"),
                AttrPath::attr("reservation_id")
            ]
        );
    }

    #[test]
    fn a_layout_dropping_a_profile_warns_naming_it() {
        let with = |orchestrator: &str, layout: &[(&str, i64)]| {
            let mut v = prior();
            v.set("orchestrator", Value::string(orchestrator));
            v.set(
                "mig_layout",
                Value::Map(
                    layout
                        .iter()
                        .map(|(k, n)| (k.to_string(), Value::Number(*n)))
                        .collect(),
                ),
            );
            v
        };
        let before = with("slurm", &[("3g.40gb", 2), ("1g.10gb", 1)]);
        let d = removed_profiles_warning(&before, &with("slurm", &[("3g.40gb", 1)])).unwrap();
        assert_eq!(d.severity, crate::framework::Severity::Warning);
        assert_eq!(d.path, Some(AttrPath::attr("mig_layout")));
        assert!(
            d.summary.contains(r#"removes profile "1g.10gb""#),
            "{}",
            d.summary
        );
        assert!(d.detail.contains("--gres=gpu:1g.10gb:1"), "{}", d.detail);
        // Whole GPUs again: both go.
        let d = removed_profiles_warning(&before, &with("kubernetes", &[])).unwrap();
        assert!(
            d.summary.contains(r#""1g.10gb", "3g.40gb""#),
            "{}",
            d.summary
        );
        // Fewer of a profile, or a new one added, removes nothing.
        assert!(removed_profiles_warning(
            &before,
            &with("slurm", &[("3g.40gb", 1), ("1g.10gb", 1), ("2g.20gb", 1)])
        )
        .is_none());
        let mut unknown = before.clone();
        unknown.set("mig_layout", Value::Unknown);
        assert!(removed_profiles_warning(&before, &unknown).is_none());
    }

    #[test]
    fn unplaceable_layout_reports_reason_and_suggestions_on_mig_layout() {
        let answer = api::CheckMigLayoutResponse {
            fits: false,
            placements: vec![],
            reason: "the instances need 9 memory slices; a GPU has 8".into(),
            suggestions: vec!["{\"3g.40gb\" = 2}".into()],
        };
        let d = mig_error(&answer).unwrap();
        assert_eq!(d.path, Some(AttrPath::attr("mig_layout")));
        assert_eq!(
            d.summary,
            "mig_layout: the instances need 9 memory slices; a GPU has 8"
        );
        assert_eq!(d.detail, "Nearest valid layouts: {\"3g.40gb\" = 2}");
    }

    #[tokio::test]
    async fn orchestrator_and_counts_are_checked_with_paths() {
        let c = TenantCluster::new(Arc::new(ProviderState::default()));
        let mut cfg = config_of(&prior());
        cfg.set("orchestrator", Value::string("nomad"));
        cfg.set("node_count", Value::Number(0));
        let err = c.validate(&cfg).await.unwrap_err();
        let summaries: Vec<&str> = err.0.iter().map(|d| d.summary.as_str()).collect();
        assert_eq!(
            summaries,
            vec![
                "orchestrator: must be \"kubernetes\" or \"slurm\" (got \"nomad\")",
                "node_count: must be at least 1 (got 0)"
            ]
        );
    }

    #[test]
    fn cuda_alone_makes_the_driver_known_at_create() {
        let cfg = config_with(&prior(), Some("12.4"), None);
        let (asked, planned) = plan_asking(None, &cfg, |_| Ok(driver("550.163.01")));
        assert_eq!(
            asked,
            Some(api::ResolveDriverRequest {
                gpu_type: "A100-80GB".into(),
                cuda_version: "12.4".into(),
                driver_version: String::new(),
                mig: false,
            })
        );
        let planned = planned.unwrap().state;
        assert_eq!(planned.get("driver_version"), &Value::string("550.163.01"));
        assert_eq!(planned.get("cuda_version"), &Value::string("12.4"));
        assert_eq!(planned.get("max_unavailable"), &Value::Number(1));
        // The create call installs what the plan showed.
        let request = create_request(&planned, &cfg).unwrap();
        assert_eq!(request.cuda_version, "12.4");
        assert_eq!(request.driver_version, "550.163.01");
        assert_eq!(request.max_unavailable, 1);
    }

    #[test]
    fn both_are_checked_together_and_the_configured_driver_is_kept() {
        let mut cfg = config_with(&prior(), Some("12.4"), Some("550.54.15"));
        cfg.set(
            "mig_layout",
            Value::Map(BTreeMap::from([("3g.40gb".to_string(), Value::Number(2))])),
        );
        let (asked, planned) = plan_asking(None, &cfg, |_| Ok(driver("550.54.15")));
        let asked = asked.unwrap();
        assert_eq!(asked.cuda_version, "12.4");
        assert_eq!(asked.driver_version, "550.54.15");
        assert!(asked.mig);
        assert_eq!(
            planned.unwrap().state.get("driver_version"),
            &Value::string("550.54.15")
        );
    }

    #[test]
    fn neither_at_create_leaves_the_driver_to_apply() {
        let cfg = config_with(&prior(), None, None);
        let (asked, planned) = plan_asking(None, &cfg, never_asked);
        assert_eq!(asked, None);
        let planned = planned.unwrap().state;
        assert!(planned.get("driver_version").is_unknown());
        assert_eq!(planned.get("cuda_version"), &Value::Null);
        let request = create_request(&planned, &cfg).unwrap();
        assert_eq!(
            (request.cuda_version, request.driver_version),
            (String::new(), String::new())
        );
    }

    #[test]
    fn neither_at_update_keeps_the_nodes_driver_and_plans_nothing() {
        let p = prior();
        let cfg = config_with(&p, None, None);
        let (asked, planned) = plan_asking(Some(&p), &cfg, never_asked);
        assert_eq!(asked, None);
        let planned = planned.unwrap();
        assert_eq!(planned.state, p);
        assert!(planned.requires_replace.is_empty());
    }

    #[test]
    fn a_second_plan_after_apply_is_empty() {
        // After applying cuda_version = "12.4" alone, the state holds the chosen driver.
        let mut applied = prior();
        applied.set("cuda_version", Value::string("12.4"));
        applied.set("driver_version", Value::string("550.163.01"));
        for cfg in [
            config_with(&applied, Some("12.4"), None),
            config_with(&applied, Some("12.4"), Some("550.163.01")),
        ] {
            let (asked, planned) = plan_asking(Some(&applied), &cfg, never_asked);
            assert_eq!(asked, None);
            assert_eq!(planned.unwrap().state, applied);
        }
    }

    #[test]
    fn a_new_cuda_version_picks_the_driver_in_place_and_rolls_the_nodes() {
        let mut p = prior();
        p.set("nodes", Value::List(vec![one_node()]));
        let cfg = config_with(&p, Some("12.8"), None);
        let (asked, planned) = plan_asking(Some(&p), &cfg, |_| Ok(driver("570.211.01")));
        assert_eq!(asked.unwrap().cuda_version, "12.8");
        let planned = planned.unwrap();
        assert!(planned.requires_replace.is_empty());
        assert_eq!(
            planned.state.get("driver_version"),
            &Value::string("570.211.01")
        );
        for name in ["status", "status_reason"] {
            assert!(planned.state.get(name).is_unknown(), "{name}");
        }
        // The node stays; the plan says its new driver.
        let Value::List(nodes) = planned.state.get("nodes") else {
            panic!("the node stays, planned")
        };
        assert_eq!(nodes[0].get("driver_version"), &Value::string("570.211.01"));
        assert_eq!(nodes[0].get("hostname"), &Value::string("node-1"));
        assert_eq!(planned.state.get("endpoint"), &Value::string("https://k"));
        let request = update_request(&p, &planned.state, &cfg).unwrap();
        assert!(request.set_driver);
        assert!(!request.set_mig_layout);
        assert_eq!(request.cuda_version, "12.8");
        assert_eq!(request.driver_version, "570.211.01");
        assert_eq!(request.max_unavailable, 0);
    }

    #[test]
    fn a_cuda_version_the_current_driver_is_chosen_for_leaves_the_nodes_known() {
        let p = prior();
        let cfg = config_with(&p, Some("12.4"), None);
        let (_, planned) = plan_asking(Some(&p), &cfg, |_| Ok(driver("550.54.15")));
        let planned = planned.unwrap().state;
        assert_eq!(planned.get("nodes"), &Value::List(vec![]));
        assert_eq!(planned.get("status"), &Value::string("running"));
        // The CUDA version is recorded all the same.
        assert!(update_request(&p, &planned, &cfg).unwrap().set_driver);
    }

    #[test]
    fn a_replacement_asks_again_for_the_new_model() {
        let mut p = prior();
        p.set("cuda_version", Value::string("12.4"));
        let mut cfg = config_with(&p, Some("12.4"), None);
        cfg.set("gpu_type", Value::string("B200"));
        let (asked, planned) = plan_asking(Some(&p), &cfg, |_| Ok(driver("570.211.01")));
        assert_eq!(asked.unwrap().gpu_type, "B200");
        let planned = planned.unwrap();
        assert_eq!(planned.requires_replace, vec![AttrPath::attr("gpu_type")]);
    }

    #[test]
    fn an_exact_driver_changes_in_place() {
        let p = prior();
        let cfg = config_with(&p, None, Some("570.211.01"));
        let (asked, planned) = plan_asking(Some(&p), &cfg, |_| Ok(driver("570.211.01")));
        let asked = asked.unwrap();
        assert_eq!(asked.cuda_version, "");
        assert_eq!(asked.driver_version, "570.211.01");
        let planned = planned.unwrap();
        assert!(planned.requires_replace.is_empty());
        assert_eq!(planned.state.get("nodes"), &Value::List(vec![]));
        let request = update_request(&p, &planned.state, &cfg).unwrap();
        assert!(request.set_driver);
        assert_eq!(request.driver_version, "570.211.01");
    }

    #[test]
    fn taking_the_cuda_version_out_keeps_the_driver() {
        let mut p = prior();
        p.set("cuda_version", Value::string("12.4"));
        let cfg = config_with(&p, None, None);
        let (asked, planned) = plan_asking(Some(&p), &cfg, never_asked);
        assert_eq!(asked, None);
        let planned = planned.unwrap().state;
        assert_eq!(planned.get("cuda_version"), &Value::Null);
        assert_eq!(planned.get("driver_version"), &Value::string("550.54.15"));
        assert_eq!(planned.get("nodes"), &Value::List(vec![]));
        // set_driver with neither: the backend keeps the nodes' driver.
        let request = update_request(&p, &planned, &cfg).unwrap();
        assert!(request.set_driver);
        assert_eq!(
            (request.cuda_version, request.driver_version),
            (String::new(), String::new())
        );
    }

    #[test]
    fn values_known_only_at_apply_are_left_to_the_backend() {
        let mut cfg = config_with(&prior(), Some("12.4"), None);
        cfg.set("gpu_type", Value::Unknown);
        let (asked, planned) = plan_asking(None, &cfg, never_asked);
        assert_eq!(asked, None);
        assert!(planned.unwrap().state.get("driver_version").is_unknown());
        let mut cfg = config_with(&prior(), None, None);
        cfg.set("cuda_version", Value::Unknown);
        let (asked, planned) = plan_asking(Some(&prior()), &cfg, never_asked);
        assert_eq!(asked, None);
        assert!(planned.unwrap().state.get("driver_version").is_unknown());
    }

    #[test]
    fn refusals_are_said_on_the_attribute_they_name() {
        let cfg = config_with(&prior(), Some("12.4"), Some("535.54.03"));
        let too_old = "driver_version: 535.54.03 is too old for CUDA 12.4, which needs at least 550.54.14 (the R535 branch runs CUDA up to 12.2)";
        let (_, planned) = plan_asking(None, &cfg, |_| {
            Err(crate::resources::checks::as_sent(Code::InvalidArgument, too_old).into())
        });
        let d = planned.unwrap_err();
        assert_eq!(d.path, Some(AttrPath::attr("driver_version")));
        assert_eq!(d.summary, too_old);

        let cfg = config_with(&prior(), Some("12.7"), None);
        let unknown = "cuda_version: unknown CUDA version '12.7' (known: 12.2, 12.4)";
        let (_, planned) = plan_asking(None, &cfg, |_| {
            Err(crate::resources::checks::as_sent(Code::InvalidArgument, unknown).into())
        });
        let d = planned.unwrap_err();
        assert_eq!(d.path, Some(AttrPath::attr("cuda_version")));
        assert_eq!(d.summary, unknown);

        // A message naming no attribute is said on the one the configuration set.
        let d = driver_refusal(
            &crate::resources::checks::as_sent(Code::InvalidArgument, "no such thing"),
            "cuda_version",
        )
        .unwrap();
        assert_eq!(d.path, Some(AttrPath::attr("cuda_version")));
        assert_eq!(d.summary, "cuda_version: no such thing");
        // A prefix must be the whole attribute name.
        let d = driver_refusal(
            &crate::resources::checks::as_sent(Code::InvalidArgument, "driver_versions: x"),
            "cuda_version",
        )
        .unwrap();
        assert_eq!(d.summary, "cuda_version: driver_versions: x");
    }

    #[test]
    fn other_failures_are_described_by_the_client_on_the_attribute() {
        let cfg = config_with(&prior(), Some("12.4"), None);
        let (_, planned) = plan_asking(None, &cfg, |_| Err(Status::unavailable("down").into()));
        let d = planned.unwrap_err();
        assert_eq!(d.summary, "described: down");
        assert_eq!(d.path, Some(AttrPath::attr("cuda_version")));
        let (_, planned) = plan_asking(None, &cfg, |_| Err(Status::unimplemented("").into()));
        let d = planned.unwrap_err();
        assert!(d
            .summary
            .starts_with("cuda_version: this gpufleet backend cannot choose drivers"));
        let (_, planned) = plan_asking(None, &cfg, |_| {
            Ok(api::ResolveDriverResponse { driver: None })
        });
        assert_eq!(
            planned.unwrap_err().summary,
            "cuda_version: the backend chose no driver"
        );
    }

    #[test]
    fn max_unavailable_defaults_to_one_and_changes_in_place() {
        let p = prior();
        let mut cfg = config_with(&p, None, None);
        cfg.set("max_unavailable", Value::Number(3));
        let (_, planned) = plan_asking(Some(&p), &cfg, never_asked);
        let planned = planned.unwrap();
        assert!(planned.requires_replace.is_empty());
        assert_eq!(planned.state.get("max_unavailable"), &Value::Number(3));
        assert_eq!(planned.state.get("nodes"), &Value::List(vec![]));
        let request = update_request(&p, &planned.state, &cfg).unwrap();
        assert_eq!(request.max_unavailable, 3);
        assert!(!request.set_driver);
    }

    #[tokio::test]
    async fn max_unavailable_zero_and_malformed_versions_are_refused_with_paths() {
        let c = TenantCluster::new(Arc::new(ProviderState::default()));
        let mut cfg = config_with(&prior(), Some(""), Some("550.54.15-open"));
        cfg.set("max_unavailable", Value::Number(0));
        let err = c.validate(&cfg).await.unwrap_err();
        let found: Vec<(Option<AttrPath>, &str)> = err
            .0
            .iter()
            .map(|d| (d.path.clone(), d.summary.as_str()))
            .collect();
        assert_eq!(
            found,
            vec![
                (
                    Some(AttrPath::attr("max_unavailable")),
                    "max_unavailable: must be at least 1 (got 0)"
                ),
                (
                    Some(AttrPath::attr("cuda_version")),
                    "cuda_version: must not be empty; leave it out instead (e.g. \"12.4\")"
                ),
                (
                    Some(AttrPath::attr("driver_version")),
                    "driver_version: \"550.54.15-open\" is not a version such as \"550.54.15\""
                ),
            ]
        );
        c.validate(&config_with(&prior(), Some("12.4"), Some("550.54.15")))
            .await
            .unwrap();
    }

    #[test]
    fn read_back_nulls_an_unasked_cuda_version() {
        let api_cluster = api::TenantCluster {
            id: "c1".into(),
            driver_version: "550.54.15".into(),
            max_unavailable: 0,
            ..Default::default()
        };
        let s = state(&api_cluster, &Value::Null);
        assert_eq!(s.get("cuda_version"), &Value::Null);
        assert_eq!(s.get("driver_version"), &Value::string("550.54.15"));
        assert_eq!(s.get("max_unavailable"), &Value::Number(1));
        let s = state(
            &api::TenantCluster {
                cuda_version: "12.4".into(),
                max_unavailable: 2,
                ..api_cluster
            },
            &Value::Null,
        );
        assert_eq!(s.get("cuda_version"), &Value::string("12.4"));
        assert_eq!(s.get("max_unavailable"), &Value::Number(2));
    }

    #[test]
    fn a_cluster_short_of_its_nodes_records_the_nodes_it_holds() {
        let held = |n: usize| api::TenantCluster {
            node_count: 2,
            nodes: vec![Default::default(); n],
            ..Default::default()
        };
        assert_eq!(
            state(&held(2), &Value::Null).get("node_count"),
            &Value::Number(2)
        );
        // One node quarantined with no replacement: the next plan shows 1 -> 2.
        assert_eq!(
            state(&held(1), &Value::Null).get("node_count"),
            &Value::Number(1)
        );
        assert_eq!(
            state(&held(0), &Value::Null).get("node_count"),
            &Value::Number(0)
        );
    }
}

#[cfg(test)]
mod create_key_tests {
    use super::*;

    fn request(name: &str, layout: &[(&str, i32)]) -> api::CreateTenantClusterRequest {
        api::CreateTenantClusterRequest {
            tenant_id: "t1".into(),
            name: name.into(),
            orchestrator: "kubernetes".into(),
            gpu_type: "H100-80GB".into(),
            node_count: 2,
            mig_layout: layout.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_same_configuration_gets_the_same_request_id_and_another_gets_another() {
        let layout = [("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)];
        let mut reversed = layout;
        reversed.reverse();
        let a = create_key(&request("train", &layout));
        assert_eq!(a, create_key(&request("train", &reversed)));
        assert!(a.starts_with("tf-") && a.len() == 35, "{a}");
        assert_ne!(a, create_key(&request("serve", &layout)));
        let mut bigger = request("train", &layout);
        bigger.node_count = 3;
        assert_ne!(a, create_key(&bigger));
        let mut preemptible = request("train", &layout);
        preemptible.preemptible = true;
        assert_ne!(a, create_key(&preemptible));
        // A dry run of the same create asks about the same request.
        let mut dry = request("train", &layout);
        dry.validate_only = true;
        assert_eq!(a, create_key(&dry));
    }
}
