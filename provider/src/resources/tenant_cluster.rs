//! `gpufleet_tenant_cluster`: a Kubernetes or Slurm cluster on whole nodes for one tenant,
//! optionally with every GPU partitioned by MIG.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;

use super::checks::{check_pool, check_quota};
use super::common::{
    answered, check_min, compared_prior, deleted, diag, found, imported, known_gpu_type,
    request_id, required_i64, required_str,
};
use crate::client::Client;
use crate::convert::{node_type, node_value};
use crate::framework::{
    changed, default_when_unset, mark_unknown, requires_replace_if_changed, AttrPath, Attribute,
    Diagnostic, Diagnostics, PlannedChange, ResourceType, Schema, Type, Value,
};
use crate::provider::ProviderState;
use crate::{times, validation};

pub struct TenantCluster {
    provider: Arc<ProviderState>,
}

impl TenantCluster {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

pub const DEFAULT_STORAGE_GIB: i64 = 100;
const ORCHESTRATORS: &[&str] = &["kubernetes", "slurm"];
const REPLACE_ON: &[&str] = &[
    "tenant",
    "name",
    "orchestrator",
    "gpu_type",
    "reservation_id",
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
];

fn state(c: &api::TenantCluster) -> Value {
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
        ("node_count", Value::Number(c.node_count)),
        ("reservation_id", reservation),
        ("storage_gib", Value::Number(c.storage_gib)),
        ("mig_layout", Value::Map(layout)),
        ("status", Value::string(&c.status)),
        ("status_reason", Value::string(&c.status_reason)),
        (
            "nodes",
            Value::List(c.nodes.iter().map(node_value).collect()),
        ),
        ("endpoint", Value::string(&c.endpoint)),
        ("credentials", Value::string(&c.credentials)),
        ("storage_path", Value::string(&c.storage_path)),
    ])
}

/// The plan without backend checks.
pub fn plan(prior: Option<&Value>, proposed: Value, config: &Value) -> PlannedChange {
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
    let Some(prior) = prior else {
        mark_unknown(&mut planned, COMPUTED);
        return PlannedChange {
            state: planned,
            requires_replace: vec![],
        };
    };
    let requires_replace = requires_replace_if_changed(prior, &planned, REPLACE_ON);
    let reshapes_nodes =
        changed(prior, &planned, "node_count") || changed(prior, &planned, "mig_layout");
    if reshapes_nodes {
        mark_unknown(&mut planned, &["nodes"]);
    }
    if reshapes_nodes || changed(prior, &planned, "storage_gib") {
        mark_unknown(&mut planned, &["status", "status_reason"]);
    }
    PlannedChange {
        state: planned,
        requires_replace,
    }
}

/// Volumes only grow.
pub fn shrink_error(prior: &Value, planned: &Value) -> Option<Diagnostic> {
    let before = prior.i64_attr("storage_gib").ok().flatten()?;
    let after = planned.i64_attr("storage_gib").ok().flatten()?;
    (after < before).then(|| {
        Diagnostic::error_at(
            AttrPath::attr("storage_gib"),
            format!("storage_gib: volumes only grow: cannot shrink from {before} to {after} GiB"),
            "Keep the current size or grow it; a smaller volume needs a new cluster.",
        )
    })
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
            format!("mig_layout: {}", answer.reason),
            detail,
        )
    })
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

/// The refusals for a cluster of `node_count` nodes of `gpu_type` drawing from
/// `reservation`, whose other clusters hold `others` nodes: the same rules the backend
/// applies at apply time, said at plan time.
pub fn reservation_errors(
    reservation: &api::Reservation,
    gpu_type: &str,
    node_count: Option<i64>,
    others: i64,
) -> Vec<Diagnostic> {
    let id = &reservation.id;
    let mut errors = vec![];
    if reservation.gpu_type != gpu_type {
        errors.push(Diagnostic::error_at(
            AttrPath::attr("reservation_id"),
            format!(
                "reservation_id: reservation {id} holds {} nodes, not {gpu_type}",
                reservation.gpu_type
            ),
            "",
        ));
    }
    if reservation.status != "active" {
        let window = |t: &Option<prost_types::Timestamp>| {
            times::canonical(t.as_ref().map(|t| t.seconds).unwrap_or_default())
        };
        errors.push(Diagnostic::error_at(
            AttrPath::attr("reservation_id"),
            format!(
                "reservation_id: reservation {id} is {} ({} to {}); clusters can draw from it only while it is active",
                reservation.status,
                window(&reservation.start_time),
                window(&reservation.end_time),
            ),
            "",
        ));
    }
    let left = (reservation.node_count - others).max(0);
    if let Some(count) = node_count.filter(|count| *count > left) {
        errors.push(Diagnostic::error_at(
            AttrPath::attr("node_count"),
            format!(
                "node_count: needs {count} nodes from reservation {id}, which has {} nodes of which other clusters hold {others} ({left} left)",
                reservation.node_count
            ),
            "Grow the reservation (node_count) first, or take fewer nodes.",
        ));
    }
    errors
}

fn layout_i32(layout: &BTreeMap<String, i64>) -> HashMap<String, i32> {
    layout
        .iter()
        .map(|(k, v)| (k.clone(), i32::try_from(*v).unwrap_or(i32::MAX)))
        .collect()
}

impl TenantCluster {
    /// Plan-time checks that ask the backend. Each runs only when the attributes it is
    /// about change (or on create/replace), so an unchanged configuration never calls the
    /// backend here and `terraform destroy` (whose pre-destroy plan runs in normal mode)
    /// cannot be blocked by them.
    async fn check_with_backend(
        &self,
        prior: Option<&Value>,
        planned: &Value,
    ) -> Result<(), Diagnostics> {
        if let Some(d) = prior.and_then(|p| shrink_error(p, planned)) {
            return Err(d.into());
        }
        let changes = |name: &str| prior.is_none_or(|p| changed(p, planned, name));
        if !changes("mig_layout") && !changes("node_count") {
            return Ok(());
        }
        let Some(client) = self.provider.plan_client() else {
            return Ok(());
        };
        let Some(gpu_type) = planned.str_attr("gpu_type").map_err(diag)? else {
            return Ok(());
        };
        let model = known_gpu_type(&client, gpu_type).await?;
        let mut diags = Diagnostics::default();
        if changes("mig_layout") {
            check_layout(&client, gpu_type, planned, &mut diags).await?;
        }
        let before = match prior {
            Some(p) => required_i64(p, "node_count")?,
            None => 0,
        };
        let grows = match planned.i64_attr("node_count").map_err(diag)? {
            Some(count) if count > before => Some(count),
            _ => None,
        };
        match planned.get("reservation_id") {
            // Clusters without a reservation take pool nodes now, counted against the quota.
            Value::Null => {
                if let Some(count) = grows {
                    check_pool(&client, gpu_type, count - before, &mut diags).await?;
                    if let Some(tenant) = planned.str_attr("tenant").map_err(diag)? {
                        check_quota(&client, tenant, &model, count - before, &mut diags).await?;
                    }
                }
            }
            // A reservation created in this same plan is unknown: the backend decides at apply.
            Value::String(reservation_id) if prior.is_none() || grows.is_some() => {
                let cluster_id = prior.and_then(|p| p.str_attr("id").ok().flatten());
                let count = planned.i64_attr("node_count").map_err(diag)?;
                let reservation = found(
                    &client,
                    client
                        .reservations()
                        .get_reservation(api::GetReservationRequest {
                            id: reservation_id.clone(),
                        })
                        .await,
                )?;
                let Some(reservation) = reservation else {
                    diags.attr_error(
                        "reservation_id",
                        format!("no reservation with id {reservation_id:?}: not found"),
                    );
                    return diags.into_result();
                };
                let request = api::ListTenantClustersRequest {
                    tenant_id: reservation.tenant_id.clone(),
                };
                let clusters = answered(
                    &client,
                    client.clusters().list_tenant_clusters(request).await,
                )?
                .clusters;
                let others: i64 = clusters
                    .iter()
                    .filter(|c| c.reservation_id == *reservation_id)
                    .filter(|c| Some(c.id.as_str()) != cluster_id)
                    .map(|c| c.node_count)
                    .sum();
                for d in reservation_errors(&reservation, gpu_type, count, others) {
                    diags.push(d);
                }
            }
            _ => {}
        }
        diags.into_result()
    }

    async fn get(
        &self,
        client: &Client,
        id: String,
    ) -> Result<Option<api::TenantCluster>, Diagnostics> {
        let request = api::GetTenantClusterRequest { id };
        found(client, client.clusters().get_tenant_cluster(request).await)
    }
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
                Attribute::required("tenant", Type::String, "Id of the tenant. Changing it forces replacement."),
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
                    "Size of the dedicated volume in GiB. Defaults to `100`. Grows in place; shrinking is refused at plan time.",
                ),
                Attribute::optional_computed(
                    "mig_layout",
                    Type::map(Type::Number),
                    "Per-GPU MIG layout (profile name to instance count) applied to every GPU. Absent or empty: whole GPUs. Checked at plan time; changes in place.",
                ),
                Attribute::computed("status", Type::String, "`running` once its nodes are assigned and their agents have applied its layout; `degraded` while a node is unreachable (until it is back or replaced); `creating`, `updating` or `deleting` while a change is under way."),
                Attribute::computed("status_reason", Type::String, "Why the status is not simply `running` (e.g. which node is unreachable, and whether a replacement is possible); empty otherwise."),
                Attribute::computed(
                    "nodes",
                    Type::list(node_type()),
                    "The cluster's nodes, their GPUs and each GPU's MIG devices.",
                ),
                Attribute::computed("endpoint", Type::String, "Kubernetes API server URL or Slurm login host:port."),
                Attribute::computed("credentials", Type::String, "A kubeconfig or Slurm login for this cluster alone.").sensitive(),
                Attribute::computed("storage_path", Type::String, "Where the cluster's volume lives."),
            ],
        )
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
        check_min(config, "storage_gib", 1, &mut diags);
        match config.number_map_attr("mig_layout") {
            Ok(Some(layout)) => {
                for (profile, count) in layout {
                    if count < 1 {
                        diags.push(Diagnostic::error_at(
                            AttrPath::attr("mig_layout").key(&profile),
                            format!("mig_layout[{profile:?}]: must be at least 1 (got {count}); leave the profile out instead"),
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
        diags.into_result()
    }

    async fn read(&self, prior: &Value) -> Result<Option<Value>, Diagnostics> {
        let client = self.provider.client()?;
        Ok(self
            .get(&client, required_str(prior, "id")?)
            .await?
            .map(|c| state(&c)))
    }

    async fn plan(
        &self,
        prior: Option<&Value>,
        proposed: Value,
        config: &Value,
    ) -> Result<PlannedChange, Diagnostics> {
        let planned = plan(prior, proposed, config);
        self.check_with_backend(compared_prior(prior, &planned), &planned.state)
            .await?;
        Ok(planned)
    }

    async fn create(&self, planned: &Value, _config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let layout = planned
            .number_map_attr("mig_layout")
            .map_err(diag)?
            .unwrap_or_default();
        let request = api::CreateTenantClusterRequest {
            request_id: request_id(),
            tenant_id: required_str(planned, "tenant")?,
            name: required_str(planned, "name")?,
            orchestrator: required_str(planned, "orchestrator")?,
            gpu_type: required_str(planned, "gpu_type")?,
            node_count: required_i64(planned, "node_count")?,
            reservation_id: planned
                .str_attr("reservation_id")
                .map_err(diag)?
                .unwrap_or_default()
                .to_string(),
            storage_gib: required_i64(planned, "storage_gib")?,
            mig_layout: layout_i32(&layout),
        };
        let created = answered(
            &client,
            client.clusters().create_tenant_cluster(request).await,
        )?;
        Ok(state(&created))
    }

    async fn update(
        &self,
        prior: &Value,
        planned: &Value,
        _config: &Value,
    ) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let layout = planned
            .number_map_attr("mig_layout")
            .map_err(diag)?
            .unwrap_or_default();
        let request = api::UpdateTenantClusterRequest {
            id: required_str(prior, "id")?,
            node_count: required_i64(planned, "node_count")?,
            storage_gib: required_i64(planned, "storage_gib")?,
            mig_layout: layout_i32(&layout),
            set_mig_layout: changed(prior, planned, "mig_layout"),
        };
        let updated = answered(
            &client,
            client.clusters().update_tenant_cluster(request).await,
        )?;
        Ok(state(&updated))
    }

    async fn delete(&self, prior: &Value) -> Result<(), Diagnostics> {
        let client = self.provider.client()?;
        let id = required_str(prior, "id")?;
        let request = api::DeleteTenantClusterRequest { id };
        deleted(
            &client,
            client.clusters().delete_tenant_cluster(request).await,
        )
    }

    async fn import(&self, id: &str) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let found = self.get(&client, id.to_string()).await?;
        Ok(state(&imported("tenant cluster", id, found)?))
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
        ])
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
    fn layout_change_is_in_place_and_makes_nodes_unknown() {
        let p = prior();
        let mut proposed = p.clone();
        proposed.set(
            "mig_layout",
            Value::Map(BTreeMap::from([("3g.40gb".to_string(), Value::Number(2))])),
        );
        let planned = plan(Some(&p), proposed.clone(), &config_of(&proposed));
        assert!(planned.requires_replace.is_empty());
        assert!(planned.state.get("nodes").is_unknown());
        assert_eq!(planned.state.get("endpoint"), &Value::string("https://k"));
        assert_eq!(
            planned.state.get("credentials"),
            &Value::string("kubeconfig")
        );
    }

    #[test]
    fn storage_growth_keeps_nodes_and_shrink_is_refused() {
        let p = prior();
        let mut proposed = p.clone();
        proposed.set("storage_gib", Value::Number(500));
        let planned = plan(Some(&p), proposed.clone(), &config_of(&proposed));
        assert_eq!(planned.state.get("nodes"), &Value::List(vec![]));
        assert!(shrink_error(&p, &planned.state).is_none());
        proposed.set("storage_gib", Value::Number(50));
        let d = shrink_error(&p, &proposed).unwrap();
        assert_eq!(
            d.summary,
            "storage_gib: volumes only grow: cannot shrink from 100 to 50 GiB"
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

    #[test]
    fn drawing_from_a_reservation_names_status_and_numbers() {
        let reservation = api::Reservation {
            id: "r1".into(),
            gpu_type: "A100-80GB".into(),
            node_count: 3,
            status: "active".into(),
            ..Default::default()
        };
        assert!(reservation_errors(&reservation, "A100-80GB", Some(2), 1).is_empty());
        let errors = reservation_errors(&reservation, "A100-80GB", Some(3), 1);
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].path, Some(AttrPath::attr("node_count")));
        assert_eq!(
            errors[0].summary,
            "node_count: needs 3 nodes from reservation r1, which has 3 nodes of which other clusters hold 1 (2 left)"
        );
        let scheduled = api::Reservation {
            status: "scheduled".into(),
            start_time: Some(times::to_proto(1_800_000_000)),
            end_time: Some(times::to_proto(1_800_003_600)),
            ..reservation
        };
        let errors = reservation_errors(&scheduled, "A100-80GB", None, 0);
        assert_eq!(errors[0].path, Some(AttrPath::attr("reservation_id")));
        assert_eq!(
            errors[0].summary,
            "reservation_id: reservation r1 is scheduled (2027-01-15T08:00:00Z to 2027-01-15T09:00:00Z); clusters can draw from it only while it is active"
        );
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
}
