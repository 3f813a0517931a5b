//! Bad input answers a clear status naming the field, and leaves the store unchanged.

mod common;

use common::*;
use gpufleet_proto::v1::*;
use tonic::Code;

const UNKNOWN: &str = "00000000-0000-0000-0000-000000000000";

#[tokio::test]
async fn bad_input_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut c = agent.admin().await;
    let (t, team_token) = c.tenant("team-a").await;
    let quota = c.quota(&t.id, "H100-80GB", 32, 0).await;
    let mut big = Clients::cluster(&t.id, "big", "H100-80GB", 1);
    big.storage_gib = 500;
    let cluster = c.create_cluster(big).await;
    let before = c.snapshot().await;
    let now = now();

    // Tenants.
    let tenant = |name: &str| CreateTenantRequest {
        request_id: format!("r-{name}"),
        name: name.into(),
        ..Default::default()
    };
    assert_status(
        c.tenants.create_tenant(tenant("")).await,
        Code::InvalidArgument,
        "name: must not be empty",
    );
    assert_status(
        c.tenants.create_tenant(tenant(&"a".repeat(64))).await,
        Code::InvalidArgument,
        "name: must be at most 63 characters (got 64)",
    );
    assert_status(
        c.tenants.create_tenant(tenant("Team_A")).await,
        Code::InvalidArgument,
        "name:",
    );
    assert_status(
        c.tenants.create_tenant(tenant("-a")).await,
        Code::InvalidArgument,
        "name:",
    );
    assert_status(
        c.tenants.create_tenant(tenant("team-a")).await,
        Code::AlreadyExists,
        &t.id,
    );
    let no_id = CreateTenantRequest {
        name: "ok".into(),
        ..Default::default()
    };
    assert_status(
        c.tenants.create_tenant(no_id).await,
        Code::InvalidArgument,
        "request_id: required",
    );

    // Quotas.
    let q = |gpu_type: &str, gpus: i64, burst: i64| CreateGpuQuotaRequest {
        request_id: format!("q-{gpu_type}-{gpus}-{burst}"),
        tenant_id: t.id.clone(),
        gpu_type: gpu_type.into(),
        gpus,
        burst_gpus: burst,
        ..Default::default()
    };
    assert_status(
        c.quotas.create_gpu_quota(q("A100-80GB", -1, 0)).await,
        Code::InvalidArgument,
        "gpus: must be at least 0 (got -1)",
    );
    assert_status(
        c.quotas.create_gpu_quota(q("A100-80GB", 8, -2)).await,
        Code::InvalidArgument,
        "burst_gpus: must be at least 0 (got -2)",
    );
    let msg = assert_status(
        c.quotas.create_gpu_quota(q("V100", 8, 0)).await,
        Code::InvalidArgument,
        "gpu_type: unknown GPU model 'V100'",
    );
    assert!(
        msg.contains("H100-80GB") && msg.contains("A100-40GB"),
        "lists the known models: {msg}"
    );
    assert_status(
        c.quotas.create_gpu_quota(q("H100-80GB", 8, 0)).await,
        Code::AlreadyExists,
        &quota.id,
    );
    let mut other = q("A100-80GB", 8, 0);
    other.tenant_id = UNKNOWN.into();
    assert_status(
        c.quotas.create_gpu_quota(other).await,
        Code::NotFound,
        UNKNOWN,
    );
    // The quotas a plan sets beside a dry run: only with one, bounded, each checked, and
    // only the admin's (a team's token counts no raise it cannot make).
    let planned = |gpus: i64| PlannedQuota {
        tenant_id: t.id.clone(),
        gpu_type: "A100-80GB".into(),
        gpus,
        burst_gpus: 0,
    };
    let with = |also: Vec<PlannedQuota>, dry: bool| CreateGpuQuotaRequest {
        also_planned: also,
        validate_only: dry,
        ..q("H100-80GB", 8, 0)
    };
    assert_status(
        c.quotas
            .create_gpu_quota(with(vec![planned(8)], false))
            .await,
        Code::InvalidArgument,
        "also_planned: only with validate_only",
    );
    assert_status(
        c.quotas
            .create_gpu_quota(with(vec![planned(8); 101], true))
            .await,
        Code::InvalidArgument,
        "also_planned: at most 100 quotas, got 101",
    );
    assert_status(
        c.quotas
            .create_gpu_quota(with(vec![planned(8), planned(-1)], true))
            .await,
        Code::InvalidArgument,
        "also_planned[1].gpus: must be at least 0 (got -1)",
    );
    let mut team = agent.clients(&team_token).await;
    let mut dry_cluster = Clients::cluster(&t.id, "dry", "H100-80GB", 1);
    dry_cluster.validate_only = true;
    dry_cluster.planned_quotas = vec![planned(8)];
    assert_status(
        team.clusters.create_tenant_cluster(dry_cluster).await,
        Code::PermissionDenied,
        "counting planned quotas (planned_quotas) needs the admin token",
    );

    // Reservations.
    let r = |nodes: i64, start: i64, end: i64| {
        Clients::reservation(&t.id, "H100-80GB", nodes, start, end)
    };
    assert_status(
        c.reservations
            .create_reservation(r(0, now + HOUR, now + 2 * HOUR))
            .await,
        Code::InvalidArgument,
        "node_count: must be at least 1 (got 0)",
    );
    assert_status(
        c.reservations
            .create_reservation(r(-3, now + HOUR, now + 2 * HOUR))
            .await,
        Code::InvalidArgument,
        "node_count",
    );
    assert_status(
        c.reservations
            .create_reservation(r(1, now + 2 * HOUR, now + HOUR))
            .await,
        Code::InvalidArgument,
        "end_time: must be after start_time",
    );
    assert_status(
        c.reservations
            .create_reservation(r(1, now - 2 * HOUR, now - HOUR))
            .await,
        Code::InvalidArgument,
        "end_time: must be in the future",
    );
    let mut model = r(1, now + HOUR, now + 2 * HOUR);
    model.gpu_type = "H100-80G".into();
    assert_status(
        c.reservations.create_reservation(model).await,
        Code::InvalidArgument,
        "gpu_type: unknown GPU model",
    );

    // Clusters.
    let k = |name: &str| Clients::cluster(&t.id, name, "H100-80GB", 1);
    assert_status(
        c.clusters.create_tenant_cluster(k("")).await,
        Code::InvalidArgument,
        "name: must not be empty",
    );
    assert_status(
        c.clusters.create_tenant_cluster(k(&"x".repeat(70))).await,
        Code::InvalidArgument,
        "name: must be at most 63",
    );
    assert_status(
        c.clusters
            .create_tenant_cluster(CreateTenantClusterRequest {
                request_id: "again".into(),
                ..k("big")
            })
            .await,
        Code::AlreadyExists,
        &cluster.id,
    );
    let mut bad = k("c1");
    bad.orchestrator = "nomad".into();
    assert_status(
        c.clusters.create_tenant_cluster(bad).await,
        Code::InvalidArgument,
        "orchestrator: must be one of kubernetes, slurm",
    );
    let mut bad = k("c2");
    bad.node_count = -1;
    assert_status(
        c.clusters.create_tenant_cluster(bad).await,
        Code::InvalidArgument,
        "node_count: must be at least 1 (got -1)",
    );
    let mut bad = k("c3");
    bad.storage_gib = -5;
    assert_status(
        c.clusters.create_tenant_cluster(bad).await,
        Code::InvalidArgument,
        "storage_gib",
    );
    let mut bad = k("c4");
    bad.reservation_id = UNKNOWN.into();
    assert_status(
        c.clusters.create_tenant_cluster(bad).await,
        Code::InvalidArgument,
        "reservation_id",
    );
    let mut bad = k("c5");
    bad.gpu_type = "".into();
    assert_status(
        c.clusters.create_tenant_cluster(bad).await,
        Code::InvalidArgument,
        "gpu_type",
    );
    let shrink = UpdateTenantClusterRequest {
        id: cluster.id.clone(),
        storage_gib: 100,
        ..Default::default()
    };
    assert_status(
        c.clusters.update_tenant_cluster(shrink).await,
        Code::FailedPrecondition,
        "storage_gib: volumes only grow: cannot shrink from 500 to 100 GiB",
    );
    let negative = UpdateTenantClusterRequest {
        id: cluster.id.clone(),
        node_count: -2,
        ..Default::default()
    };
    assert_status(
        c.clusters.update_tenant_cluster(negative).await,
        Code::InvalidArgument,
        "node_count",
    );

    // Unknown ids, for every kind and verb.
    assert_status(
        c.tenants
            .get_tenant(GetTenantRequest { id: UNKNOWN.into() })
            .await,
        Code::NotFound,
        "tenant",
    );
    assert_status(
        c.tenants
            .update_tenant(UpdateTenantRequest {
                id: UNKNOWN.into(),
                ..Default::default()
            })
            .await,
        Code::NotFound,
        "tenant",
    );
    assert_status(
        c.tenants
            .delete_tenant(DeleteTenantRequest {
                id: UNKNOWN.into(),
                ..Default::default()
            })
            .await,
        Code::NotFound,
        "tenant",
    );
    assert_status(
        c.quotas
            .get_gpu_quota(GetGpuQuotaRequest { id: UNKNOWN.into() })
            .await,
        Code::NotFound,
        "gpu quota",
    );
    assert_status(
        c.quotas
            .update_gpu_quota(UpdateGpuQuotaRequest {
                id: UNKNOWN.into(),
                gpus: 1,
                burst_gpus: 0,
                ..Default::default()
            })
            .await,
        Code::NotFound,
        "gpu quota",
    );
    assert_status(
        c.quotas
            .delete_gpu_quota(DeleteGpuQuotaRequest {
                id: UNKNOWN.into(),
                ..Default::default()
            })
            .await,
        Code::NotFound,
        "gpu quota",
    );
    assert_status(
        c.reservations
            .get_reservation(GetReservationRequest { id: UNKNOWN.into() })
            .await,
        Code::NotFound,
        "reservation",
    );
    assert_status(
        c.reservations
            .update_reservation(Clients::resize_reservation(UNKNOWN, 1))
            .await,
        Code::NotFound,
        "reservation",
    );
    assert_status(
        c.reservations
            .delete_reservation(DeleteReservationRequest { id: UNKNOWN.into() })
            .await,
        Code::NotFound,
        "reservation",
    );
    assert_status(
        c.clusters
            .get_tenant_cluster(GetTenantClusterRequest { id: UNKNOWN.into() })
            .await,
        Code::NotFound,
        "tenant cluster",
    );
    assert_status(
        c.clusters
            .delete_tenant_cluster(DeleteTenantClusterRequest { id: UNKNOWN.into() })
            .await,
        Code::NotFound,
        "tenant cluster",
    );

    c.assert_unchanged(&before, "no failed request changed the store")
        .await;
    let names: Vec<_> = std::fs::read_dir(agent.data_dir.join("volumes").join(&t.id))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        vec!["big"],
        "no failed create left a storage directory"
    );
}

#[tokio::test]
async fn names_shaped_like_ids_keyless_labels_and_century_long_reservations_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut c = agent.admin().await;
    let (a, _) = c.tenant("team-a").await;
    c.quota(&a.id, "H100-80GB", 8, 0).await;
    let before = c.snapshot().await;

    // Another tenant's id as a name: a later reference by that name would reach team-a.
    let impostor = status(
        c.tenants
            .create_tenant(CreateTenantRequest {
                request_id: "r-impostor".into(),
                name: a.id.clone(),
                ..Default::default()
            })
            .await,
    );
    assert_eq!(impostor.code(), Code::InvalidArgument);
    assert!(
        impostor.message().starts_with("name: ") && impostor.message().contains("tenant id"),
        "{}",
        impostor.message()
    );

    let keyless = || std::collections::HashMap::from([(String::new(), "x".to_string())]);
    assert_status(
        c.tenants
            .create_tenant(CreateTenantRequest {
                request_id: "r-labels".into(),
                name: "team-b".into(),
                labels: keyless(),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "labels: a label's key must not be empty",
    );
    assert_status(
        c.tenants
            .update_tenant(UpdateTenantRequest {
                id: a.id.clone(),
                labels: keyless(),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "labels: a label's key must not be empty",
    );

    // 150 years of one node: refused, on create and when an update stretches one.
    let t = now();
    let century = 150 * 365 * 24 * HOUR;
    let long = status(
        c.reservations
            .create_reservation(Clients::reservation(
                &a.id,
                "H100-80GB",
                1,
                t + HOUR,
                t + century,
            ))
            .await,
    );
    assert_eq!(long.code(), Code::InvalidArgument);
    assert!(
        long.message()
            .starts_with("end_time: a reservation lasts at most 3660 days"),
        "{}",
        long.message()
    );
    assert_eq!(c.snapshot().await, before, "nothing was written");
    let r = c
        .create_reservation(&a.id, "H100-80GB", 1, t + HOUR, t + 2 * HOUR)
        .await;
    let mut stretch = Clients::reservation_update(&r.id);
    stretch.end_time = ts(t + century);
    let refused = status(c.reservations.update_reservation(stretch).await);
    assert_eq!(
        refused.code(),
        Code::InvalidArgument,
        "{}",
        refused.message()
    );
    assert!(refused
        .message()
        .starts_with("end_time: a reservation lasts at most"));
}
