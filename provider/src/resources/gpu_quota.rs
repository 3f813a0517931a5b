//! `gpufleet_gpu_quota`: how many GPUs of one model a tenant may hold.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;

use super::checks::{adopt_hint, import_tenant, verdict, written, Asked};
use super::common::{
    answered, check_min, deleted, diag, found, import_id, imported, imported_tenant,
    known_gpu_type, note_prior, optional_tenant, request_id, required_i64, required_str,
    respelled_prior, with_tenant_spelling, ImportId,
};
use crate::framework::{
    changed, default_when_unset, mark_unknown, requires_replace_if_changed, Attribute, Diagnostics,
    PlannedChange, ResourceType, Schema, Type, Value,
};
use crate::state::ProviderState;
use crate::this_run::QuotaChange;

pub struct GpuQuota {
    provider: Arc<ProviderState>,
}

impl GpuQuota {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

const REPLACE_ON: &[&str] = &["tenant", "gpu_type"];

fn state(q: &api::GpuQuota) -> Value {
    Value::object([
        ("id", Value::string(&q.id)),
        ("tenant", Value::string(&q.tenant_id)),
        ("gpu_type", Value::string(&q.gpu_type)),
        ("gpus", Value::Number(q.gpus)),
        ("burst_gpus", Value::Number(q.burst_gpus)),
        // A backend from before weights answers 0: every quota weighed 1 there.
        ("weight", Value::Number(q.weight.max(1))),
        (
            "lending_limit_gpus",
            q.lending_limit_gpus.map_or(Value::Null, Value::Number),
        ),
    ])
}

/// The plan without backend checks.
pub fn plan(prior: Option<&Value>, proposed: Value, config: &Value) -> PlannedChange {
    let mut planned = proposed;
    default_when_unset(&mut planned, config, "burst_gpus", Value::Number(0));
    default_when_unset(&mut planned, config, "weight", Value::Number(1));
    let requires_replace = match prior {
        None => {
            mark_unknown(&mut planned, &["id"]);
            vec![]
        }
        Some(prior) => requires_replace_if_changed(prior, &planned, REPLACE_ON),
    };
    PlannedChange {
        state: planned,
        requires_replace,
    }
}

/// The create call for a planned quota (a dry run at plan time, the real one at apply).
fn create_request(planned: &Value) -> Result<api::CreateGpuQuotaRequest, Diagnostics> {
    Ok(api::CreateGpuQuotaRequest {
        request_id: request_id(),
        tenant_id: optional_tenant(planned)?,
        gpu_type: required_str(planned, "gpu_type")?,
        gpus: required_i64(planned, "gpus")?,
        burst_gpus: required_i64(planned, "burst_gpus")?,
        validate_only: false,
        also_planned: vec![],
        weight: Some(required_i64(planned, "weight")?),
        lending_limit_gpus: planned.i64_attr("lending_limit_gpus").map_err(diag)?,
    })
}

fn update_request(
    prior: &Value,
    planned: &Value,
) -> Result<api::UpdateGpuQuotaRequest, Diagnostics> {
    Ok(api::UpdateGpuQuotaRequest {
        id: required_str(prior, "id")?,
        gpus: required_i64(planned, "gpus")?,
        burst_gpus: required_i64(planned, "burst_gpus")?,
        validate_only: false,
        also_planned: vec![],
        weight: Some(required_i64(planned, "weight")?),
        lending_limit_gpus: planned.i64_attr("lending_limit_gpus").map_err(diag)?,
        set_sharing: true,
    })
}

/// The attributes whose change an update sends to the backend's dry run.
const CHECKED_ON_UPDATE: &[&str] = &["gpus", "burst_gpus", "weight", "lending_limit_gpus"];

impl GpuQuota {
    /// Plan-time admission: the backend's dry run of the create or update this plan
    /// applies (a tenant has one quota per model, guarantees fit the pool, a limit is not
    /// lowered below what the tenant holds). Skipped while an input is unknown, on the
    /// replace half of a replacement (Terraform plans its create half as a create), and
    /// on an update that leaves the limits as they are (so an unchanged configuration
    /// never blocks the pre-destroy plan of `terraform destroy`). The quotas of the same
    /// model this plan creates or changes beside it count as they will be: quotas that
    /// cannot all fit the pool are refused at plan (the one planned last, naming the
    /// others), and a raise counts the lowering planned beside it.
    async fn check_with_backend(
        &self,
        prior: Option<&Value>,
        planned: &PlannedChange,
    ) -> Result<(), Diagnostics> {
        let state = &planned.state;
        // A destroy creates nothing (see `destroy_run`).
        if prior.is_none() && super::destroy_run::destroying() {
            return Ok(());
        }
        if let Some(prior) = prior {
            let limits_change = CHECKED_ON_UPDATE
                .iter()
                .any(|name| changed(prior, state, name));
            if !limits_change || !planned.requires_replace.is_empty() {
                return Ok(());
            }
        }
        let Some(client) = self.provider.plan_client() else {
            return Ok(());
        };
        if let Some(gpu_type) = state.str_attr("gpu_type").map_err(diag)? {
            known_gpu_type(&client, gpu_type).await?;
        }
        let known = [
            "gpu_type",
            "gpus",
            "burst_gpus",
            "weight",
            "lending_limit_gpus",
        ]
        .iter()
        .all(|name| !state.get(name).is_unknown());
        // A new quota of a tenant known only at apply (`gpufleet_tenant.x.id` of a tenant
        // this plan creates) must still fit the pool beside the plan's other quotas: its
        // dry run names a stand-in no tenant has (the backend checks the pool, then does
        // not find the tenant).
        let stand_in = prior.is_none() && state.get("tenant").is_unknown();
        if !known || (state.get("tenant").is_unknown() && !stand_in) {
            return Ok(());
        }
        let tenant = match stand_in {
            true => format!("{STAND_IN}{}", super::common::request_id()),
            false => optional_tenant(state)?,
        };
        let (me, raises, lowers) = planned_quota(prior, state, &tenant)?;
        let run = &self.provider.run;
        loop {
            // The quotas this plan sets beside this one count as they will be.
            let (seen, siblings) = run.planned_quotas(&me.gpu_type, &tenant, MAX_SIBLINGS);
            let answer = dry_run(&client, prior, state, &tenant, siblings.clone()).await?;
            // A sibling planned later (a lowering) may make room: ask again with it.
            if let Err(s) = &answer {
                if over_pool(s) && run.quota_admitted_since(seen, SIBLINGS_GRACE).await {
                    continue;
                }
            }
            let asked = Asked {
                tenant: &tenant,
                gpu_type: None,
            };
            let fields = written(&self.schema());
            let taken = prior.is_none()
                && matches!(&answer, Err(s) if s.code() == tonic::Code::AlreadyExists);
            let verdict = match answer {
                // The stand-in's answer once the pool admitted the guarantee.
                Err(s) if stand_in && super::common::tenant_not_found(&s) => Ok(()),
                answer => verdict(&client, run, asked, answer, &fields, "gpus").await,
            };
            match verdict {
                Ok(()) if run.admits_quota(seen, me.clone(), raises, lowers) => return Ok(()),
                Ok(()) => continue,
                Err(mut diags) => {
                    if taken {
                        let id = format!(
                            "{}/{}",
                            import_tenant(&client, &tenant).await,
                            required_str(state, "gpu_type")?
                        );
                        adopt_hint(&mut diags, "gpu_type", "gpufleet_gpu_quota", &id);
                    }
                    return Err(counted_beside(diags, &siblings));
                }
            }
        }
    }
}

/// The quota as the plan leaves it, for the dry runs of its siblings, and whether it
/// raises what the tenant may use (a create, or more GPUs in all) and lowers its
/// guarantee.
fn planned_quota(
    prior: Option<&Value>,
    state: &Value,
    tenant: &str,
) -> Result<(api::PlannedQuota, bool, bool), Diagnostics> {
    let me = api::PlannedQuota {
        tenant_id: tenant.to_string(),
        gpu_type: required_str(state, "gpu_type")?,
        gpus: required_i64(state, "gpus")?,
        burst_gpus: required_i64(state, "burst_gpus")?,
    };
    let Some(prior) = prior else {
        return Ok((me, true, false));
    };
    let (gpus, burst) = (
        required_i64(prior, "gpus")?,
        required_i64(prior, "burst_gpus")?,
    );
    let raises = me.gpus + me.burst_gpus > gpus + burst;
    let lowers = me.gpus < gpus;
    Ok((me, raises, lowers))
}

/// The backend's dry run of the create (for `tenant` as the plan spells it, or a stand-in)
/// or update the plan applies, counting `siblings` as they will be.
async fn dry_run(
    client: &crate::client::Client,
    prior: Option<&Value>,
    state: &Value,
    tenant: &str,
    siblings: Vec<api::PlannedQuota>,
) -> Result<Result<tonic::Response<()>, tonic::Status>, Diagnostics> {
    let answer = match prior {
        None => {
            let request = api::CreateGpuQuotaRequest {
                validate_only: true,
                also_planned: siblings,
                tenant_id: tenant.to_string(),
                ..create_request(state)?
            };
            client.quotas().create_gpu_quota(request).await.map(|_| ())
        }
        Some(prior) => {
            let request = api::UpdateGpuQuotaRequest {
                validate_only: true,
                also_planned: siblings,
                ..update_request(prior, state)?
            };
            client.quotas().update_gpu_quota(request).await.map(|_| ())
        }
    };
    Ok(answer.map(tonic::Response::new))
}

/// How a plan's dry runs spell a tenant known only at apply (with a random suffix, so
/// that no tenant has it and two such quotas are two).
const STAND_IN: &str = "(a tenant this plan creates) ";

/// At most this many quotas of the plan a dry run counts beside its own (the API's bound).
const MAX_SIBLINGS: usize = 100;

/// How long a quota refused at plan for the pool waits for the other quotas of the same
/// plan (a lowering planned beside a raise) before the refusal stands.
const SIBLINGS_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// How long a quota refused at apply for the pool waits for the lowerings beside it.
const LOWERINGS_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Whether a refusal says the pool cannot keep the guarantee beside the other quotas' (a
/// lowering of another quota may make room), from its `ErrorInfo`.
fn over_pool(status: &tonic::Status) -> bool {
    use tonic_types::StatusExt;
    status.code() == tonic::Code::FailedPrecondition
        && status.get_details_error_info().is_some_and(|i| {
            i.metadata
                .contains_key(gpufleet_proto::error_info::OVER_POOL)
        })
}

/// A refusal that counted other quotas of the plan says which, with their numbers.
fn counted_beside(mut diags: Diagnostics, siblings: &[api::PlannedQuota]) -> Diagnostics {
    if siblings.is_empty() {
        return diags;
    }
    let listed: Vec<String> = siblings
        .iter()
        .map(|q| {
            let whose = match q.tenant_id.strip_prefix(STAND_IN) {
                Some(_) => "a tenant known after apply".to_string(),
                None => format!("tenant '{}'", q.tenant_id),
            };
            format!("{whose}: {} guaranteed + {} burst", q.gpus, q.burst_gpus)
        })
        .collect();
    let note = format!(
        "Counted with the {} quotas this plan also creates or changes, as they will be: {}. Terraform plans and applies them in one run, so together they must fit.",
        siblings[0].gpu_type,
        listed.join("; ")
    );
    for d in diags.0.iter_mut() {
        d.detail = if d.detail.is_empty() {
            note.clone()
        } else {
            format!("{} {note}", d.detail)
        };
    }
    diags
}

impl GpuQuota {
    /// Sends a create or update; when it is refused for the pool and this run applies
    /// lowerings of the same model beside it (Terraform applies them in no order), waits
    /// until they are done and sends it once more.
    async fn after_lowerings<T, F>(
        &self,
        tenant: &str,
        gpu_type: &str,
        send: impl Fn() -> F,
    ) -> Result<tonic::Response<T>, tonic::Status>
    where
        F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match send().await {
            Err(s) if over_pool(&s) => {
                let run = &self.provider.run;
                let lowering = QuotaChange::Lowering;
                if run
                    .quota_changes_applied(gpu_type, tenant, lowering, LOWERINGS_LIMIT)
                    .await
                {
                    send().await
                } else {
                    Err(s)
                }
            }
            answer => answer,
        }
    }
}

/// Marks a quota's create or update as ended when dropped, whatever its answer, so that
/// what waits for it at apply goes on.
struct Applied<'a> {
    run: &'a crate::this_run::ThisRun,
    tenant: String,
    gpu_type: String,
}

impl<'a> Applied<'a> {
    fn new(run: &'a crate::this_run::ThisRun, tenant: &str, gpu_type: &str) -> Self {
        Self {
            run,
            tenant: tenant.to_string(),
            gpu_type: gpu_type.to_string(),
        }
    }
}

impl Drop for Applied<'_> {
    fn drop(&mut self) {
        self.run.quota_applied(&self.tenant, &self.gpu_type);
    }
}

/// How long a quota's delete waits for the deletes of its users to begin or be planned
/// beside it.
const USERS_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// The quota of `gpu_type` of the tenant spelled `tenant` (a tenant this token may not
/// see is an error that lists those it may).
async fn of_model(
    client: &crate::client::Client,
    tenant: &str,
    gpu_type: &str,
) -> Result<Option<api::GpuQuota>, Diagnostics> {
    let mut page_token = String::new();
    loop {
        let request = api::ListGpuQuotasRequest {
            tenant_id: tenant.to_string(),
            page_size: 0,
            page_token,
        };
        let page = answered(client, client.quotas().list_gpu_quotas(request).await)?;
        if let Some(q) = page.quotas.into_iter().find(|q| q.gpu_type == gpu_type) {
            return Ok(Some(q));
        }
        if page.next_page_token.is_empty() {
            return Ok(None);
        }
        page_token = page.next_page_token;
    }
}

/// `lending_limit_gpus` lends guaranteed GPUs only: at most `gpus`, when both are known.
fn check_lending_limit(config: &Value, diags: &mut Diagnostics) {
    if let (Ok(Some(lend)), Ok(Some(gpus))) = (
        config.i64_attr("lending_limit_gpus"),
        config.i64_attr("gpus"),
    ) {
        if lend > gpus {
            diags.attr_error(
                "lending_limit_gpus",
                format!("{lend} is more than the quota's {gpus} guaranteed GPUs (gpus); only guaranteed GPUs are lent: set it to at most {gpus}, or leave it out for no limit"),
            );
        }
    }
}

#[async_trait]
impl ResourceType for GpuQuota {
    fn name(&self) -> &'static str {
        "gpu_quota"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "A tenant's quota of one GPU model: guaranteed GPUs plus burst GPUs.",
            vec![
                Attribute::computed("id", Type::String, "The quota's id, assigned by the backend."),
                Attribute::optional_computed(
                    "tenant",
                    Type::String,
                    "The tenant, by id or by name (a `gpufleet_tenant`'s `id` or `name`; state keeps what you write). With a tenant token it may be left out: the token's own tenant (a state that names it, as an import by `TENANT/NAME` writes, keeps that spelling). Changing it forces replacement.",
                ),
                Attribute::required(
                    "gpu_type",
                    Type::String,
                    "GPU model, e.g. `H100-80GB`. Changing it forces replacement.",
                ),
                Attribute::required(
                    "gpus",
                    Type::Number,
                    "Guaranteed GPUs, 0 or more. Changes in place; lowering it below what the tenant uses and reserves is refused at plan time.",
                ),
                Attribute::optional_computed(
                    "burst_gpus",
                    Type::Number,
                    "Extra GPUs the tenant may use from idle pool or on-demand capacity. Defaults to `0`. Changes in place.",
                ),
                Attribute::optional_computed(
                    "weight",
                    Type::Number,
                    "The tenant's weight in fair sharing of idle capacity, 1 to 1000: pool nodes taken back from preemptible clusters come first from the tenant furthest above its weighted share (pool GPUs held beyond the guarantee / weight). Defaults to `1`. Changes in place.",
                ),
                Attribute::optional(
                    "lending_limit_gpus",
                    Type::Number,
                    "How many of the tenant's idle guaranteed GPUs other tenants' clusters may use, 0 to `gpus`; unset: no limit, `0`: none is lent. Changes in place.",
                ),
            ],
        )
    }

    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let mut diags = Diagnostics::default();
        check_min(config, "gpus", 0, &mut diags);
        check_min(config, "burst_gpus", 0, &mut diags);
        check_min(config, "weight", 1, &mut diags);
        check_min(config, "lending_limit_gpus", 0, &mut diags);
        check_lending_limit(config, &mut diags);
        diags.into_result()
    }

    async fn read(&self, prior: &Value) -> Result<Option<Value>, Diagnostics> {
        let client = self.provider.client()?;
        let id = required_str(prior, "id")?;
        let quota = found(
            &client,
            client
                .quotas()
                .get_gpu_quota(api::GetGpuQuotaRequest { id })
                .await,
        )?;
        Ok(quota
            .as_ref()
            .map(|q| with_tenant_spelling(state(q), prior, &q.tenant_id, &q.tenant_name)))
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
        let planned = plan(prior, proposed, config);
        note_prior(&self.provider.run, prior);
        // A cluster that depends on this quota is planned after it, and may count on it.
        if prior.is_none() || !planned.requires_replace.is_empty() {
            if let (Ok(tenant), Ok(Some(gpu_type))) = (
                optional_tenant(&planned.state),
                planned.state.str_attr("gpu_type"),
            ) {
                if !planned.state.get("tenant").is_unknown() {
                    self.provider.run.creates_quota(&tenant, gpu_type);
                }
            }
        }
        self.check_with_backend(prior, &planned).await?;
        Ok(planned)
    }

    async fn create(&self, planned: &Value, _config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let request = create_request(planned)?;
        let _applied = Applied::new(&self.provider.run, &request.tenant_id, &request.gpu_type);
        let answer = self
            .after_lowerings(&request.tenant_id, &request.gpu_type, || {
                let (mut quotas, request) = (client.quotas(), request.clone());
                async move { quotas.create_gpu_quota(request).await }
            })
            .await;
        let created = answered(&client, answer)?;
        Ok(with_tenant_spelling(
            state(&created),
            planned,
            &created.tenant_id,
            &created.tenant_name,
        ))
    }

    async fn update(
        &self,
        prior: &Value,
        planned: &Value,
        _config: &Value,
    ) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let request = update_request(prior, planned)?;
        let tenant = optional_tenant(planned)?;
        let gpu_type = required_str(planned, "gpu_type")?;
        let _applied = Applied::new(&self.provider.run, &tenant, &gpu_type);
        let answer = self
            .after_lowerings(&tenant, &gpu_type, || {
                let (mut quotas, request) = (client.quotas(), request.clone());
                async move { quotas.update_gpu_quota(request).await }
            })
            .await;
        let updated = answered(&client, answer)?;
        Ok(with_tenant_spelling(
            state(&updated),
            planned,
            &updated.tenant_id,
            &updated.tenant_name,
        ))
    }

    /// Deletes the quota. Its clusters and reservations may be deleted beside it in the
    /// same run (nothing orders them): while they are, the delete waits and tries again.
    async fn delete(&self, prior: &Value) -> Result<(), Diagnostics> {
        let client = self.provider.client()?;
        let id = required_str(prior, "id")?;
        let tenant = optional_tenant(prior)?;
        let run = &self.provider.run;
        let _under_way = run.deleting(&[&id, &tenant]);
        loop {
            let request = api::DeleteGpuQuotaRequest {
                id: id.clone(),
                validate_only: false,
            };
            let since = run.deletes_ended();
            match client.quotas().delete_gpu_quota(request).await {
                Err(s) if !super::checks::used_by(&s).is_empty() => {
                    let users = super::checks::used_by(&s);
                    let keys: Vec<&str> = users.iter().map(String::as_str).collect();
                    if !run.dependents_deleted(&keys, USERS_GRACE, since).await {
                        return Err(client.diagnostic(&s).into());
                    }
                }
                answer => return deleted(&client, answer),
            }
        }
    }

    /// Refuses at plan to delete a quota that clusters or reservations still use, unless
    /// the same plan deletes them too: the apply would delete some of a team's quotas and
    /// then fail on the next.
    async fn plan_delete(&self, prior: &Value) -> Result<(), Diagnostics> {
        // Its tenant may be deleted by the same plan.
        self.provider.run.plans_delete(&required_str(prior, "id")?);
        let Some(client) = self.provider.plan_client() else {
            return Ok(());
        };
        let request = api::DeleteGpuQuotaRequest {
            id: required_str(prior, "id")?,
            validate_only: true,
        };
        let status = match client.quotas().delete_gpu_quota(request).await {
            Ok(_) => return Ok(()),
            Err(s) if s.code() == tonic::Code::NotFound => return Ok(()),
            Err(s) => s,
        };
        let users = super::checks::used_by(&status);
        if users.is_empty() {
            return Err(client.diagnostic(&status).into());
        }
        if self
            .provider
            .run
            .unplanned_deletes(&users, USERS_GRACE)
            .await
            .is_empty()
        {
            return Ok(());
        }
        Err(crate::framework::Diagnostic::error(
            status.message().to_string(),
            "Delete them in the same change, or keep the quota until they are gone: the apply would otherwise delete some quotas and then fail.",
        )
        .into())
    }

    async fn import(&self, id: &str) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let (quota, written) = match import_id(id) {
            ImportId::Id(id) => {
                let request = api::GetGpuQuotaRequest { id: id.to_string() };
                match found(&client, client.quotas().get_gpu_quota(request).await)? {
                    Some(q) => (Some(q), None),
                    // A tenant token may name its own tenant's quota by model alone.
                    None => match client.own_tenant().await {
                        Some(own) => (of_model(&client, &own, id).await?, None),
                        None => (None, None),
                    },
                }
            }
            ImportId::Named { tenant, name } => {
                (of_model(&client, tenant, name).await?, Some(tenant))
            }
        };
        let quota = imported(
            "GPU quota",
            id,
            "its id or TENANT/GPU_TYPE (with a tenant token, GPU_TYPE alone)",
            quota,
        )?;
        let mut s = state(&quota);
        s.set(
            "tenant",
            imported_tenant(&client, written, &quota.tenant_id).await,
        );
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::AttrPath;

    #[test]
    fn burst_defaults_to_zero_and_id_is_unknown_on_create() {
        let cfg = Value::object([("gpus", Value::Number(16))]);
        let planned = plan(None, cfg.clone(), &cfg);
        assert_eq!(planned.state.get("burst_gpus"), &Value::Number(0));
        assert_eq!(planned.state.get("weight"), &Value::Number(1));
        assert!(planned.state.get("lending_limit_gpus").is_null());
        assert!(planned.state.get("id").is_unknown());
    }

    #[test]
    fn a_lending_limit_past_the_guarantee_is_refused_on_its_attribute() {
        let cfg = |lend: i64| {
            Value::object([
                ("gpus", Value::Number(16)),
                ("lending_limit_gpus", Value::Number(lend)),
            ])
        };
        let mut diags = Diagnostics::default();
        check_lending_limit(&cfg(16), &mut diags);
        assert!(!diags.has_errors());
        check_lending_limit(&cfg(24), &mut diags);
        assert_eq!(diags.0.len(), 1);
        assert_eq!(diags.0[0].path, Some(AttrPath::attr("lending_limit_gpus")));
        assert_eq!(
            diags.0[0].summary,
            "lending_limit_gpus: 24 is more than the quota's 16 guaranteed GPUs (gpus); only guaranteed GPUs are lent: set it to at most 16, or leave it out for no limit"
        );
        // Unknown until apply: nothing to check yet.
        let unknown = Value::object([
            ("gpus", Value::Unknown),
            ("lending_limit_gpus", Value::Number(24)),
        ]);
        let mut diags = Diagnostics::default();
        check_lending_limit(&unknown, &mut diags);
        assert!(!diags.has_errors());
    }

    #[test]
    fn no_lending_limit_reads_back_as_null_and_an_old_backends_weight_as_1() {
        let q = api::GpuQuota {
            id: "q1".into(),
            gpus: 16,
            weight: 0,
            lending_limit_gpus: None,
            ..Default::default()
        };
        assert_eq!(state(&q).get("weight"), &Value::Number(1));
        assert!(state(&q).get("lending_limit_gpus").is_null());
        let q = api::GpuQuota {
            weight: 3,
            lending_limit_gpus: Some(0),
            ..q
        };
        assert_eq!(state(&q).get("weight"), &Value::Number(3));
        assert_eq!(state(&q).get("lending_limit_gpus"), &Value::Number(0));
    }

    #[test]
    fn a_create_or_more_gpus_raises_and_fewer_guaranteed_lowers() {
        let quota = |gpus: i64, burst: i64| {
            Value::object([
                ("gpu_type", Value::string("H100-80GB")),
                ("gpus", Value::Number(gpus)),
                ("burst_gpus", Value::Number(burst)),
            ])
        };
        let kind = |prior: Option<&Value>, planned: &Value| {
            let (q, raises, lowers) = planned_quota(prior, planned, "team").unwrap();
            assert_eq!(q.tenant_id, "team");
            (raises, lowers)
        };
        assert_eq!(kind(None, &quota(8, 0)), (true, false));
        assert_eq!(kind(Some(&quota(8, 0)), &quota(16, 0)), (true, false));
        assert_eq!(kind(Some(&quota(16, 0)), &quota(8, 0)), (false, true));
        // Guarantee moved to burst: lowers the guarantee, raises nothing.
        assert_eq!(kind(Some(&quota(16, 0)), &quota(8, 8)), (false, true));
        assert_eq!(kind(Some(&quota(16, 0)), &quota(8, 16)), (true, true));
    }

    #[test]
    fn tenant_and_model_force_replacement() {
        let prior = Value::object([
            ("id", Value::string("q1")),
            ("tenant", Value::string("t1")),
            ("gpu_type", Value::string("H100-80GB")),
            ("gpus", Value::Number(16)),
            ("burst_gpus", Value::Number(0)),
        ]);
        let mut proposed = prior.clone();
        proposed.set("gpus", Value::Number(8));
        assert!(plan(Some(&prior), proposed.clone(), &proposed)
            .requires_replace
            .is_empty());
        proposed.set("gpu_type", Value::string("A100-80GB"));
        assert_eq!(
            plan(Some(&prior), proposed.clone(), &proposed).requires_replace,
            vec![AttrPath::attr("gpu_type")]
        );
    }
}
