//! Every service end to end through the real binary, and a restart on the same data dir.

mod common;

use std::os::unix::fs::PermissionsExt;

use common::*;
use gpufleet_proto::v1::*;

#[tokio::test]
async fn every_service_round_trip_and_state_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agent = Agent::start(&data);
    let mut c = agent.admin().await;

    // Fleet: the built-in default.
    let types = c.gpu_types().await;
    let counts: Vec<(String, i64, i64, i32)> = types
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                t.pool_nodes,
                t.on_demand_nodes,
                t.gpus_per_node,
            )
        })
        .collect();
    assert_eq!(
        counts,
        vec![
            ("A100-80GB".into(), 2, 0, 8),
            ("H100-80GB".into(), 4, 4, 8),
            ("H200-141GB".into(), 2, 0, 8)
        ]
    );
    let nodes = c.nodes().await;
    assert_eq!(nodes.len(), 12);
    let first = nodes
        .iter()
        .find(|n| n.hostname == "h100-80gb-pool-01")
        .unwrap();
    assert_eq!(
        (
            first.capacity.as_str(),
            first.gpus.len(),
            first.driver_version.as_str()
        ),
        ("pool", 8, "550.54.15")
    );
    assert!(
        first.gpus[0].uuid.starts_with("GPU-")
            && first.gpus[0].memory_mib > 80_000
            && !first.gpus[0].mig_enabled
    );
    let avail = c
        .fleet
        .get_availability(AvailabilityRequest {
            gpu_type: "H100-80GB".into(),
            start_time: None,
            end_time: ts(now() + HOUR),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((avail.free_pool_nodes, avail.free_on_demand_nodes), (4, 4));

    // Tenants.
    let (tenant, token) = c.tenant("team-a").await;
    assert!(token.starts_with("gft_"));
    let updated = c
        .tenants
        .update_tenant(UpdateTenantRequest {
            id: tenant.id.clone(),
            display_name: "Team A".into(),
            labels: [("cost-center".to_string(), "42".to_string())].into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(updated.display_name, "Team A");
    let got = c
        .tenants
        .get_tenant(GetTenantRequest {
            id: tenant.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got, updated);

    // Quotas.
    let quota = c.quota(&tenant.id, "H100-80GB", 24, 8).await;
    let quota = c
        .quotas
        .update_gpu_quota(UpdateGpuQuotaRequest {
            id: quota.id.clone(),
            gpus: 32,
            burst_gpus: 8,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((quota.gpus, quota.burst_gpus), (32, 8));
    // Weight and lending limit change only when the update says so: a client from before
    // them (no set_sharing) leaves them, the limit cut to the new guarantee.
    let update = |gpus, set_sharing| UpdateGpuQuotaRequest {
        id: quota.id.clone(),
        gpus,
        burst_gpus: 8,
        weight: Some(3),
        lending_limit_gpus: Some(16),
        set_sharing,
        ..Default::default()
    };
    let shared = c.quotas.update_gpu_quota(update(32, true)).await.unwrap();
    let shared = shared.into_inner();
    assert_eq!((shared.weight, shared.lending_limit_gpus), (3, Some(16)));
    let older = UpdateGpuQuotaRequest {
        weight: None,
        lending_limit_gpus: None,
        ..update(8, false)
    };
    let kept = c.quotas.update_gpu_quota(older).await.unwrap().into_inner();
    assert_eq!(
        (kept.gpus, kept.weight, kept.lending_limit_gpus),
        (8, 3, Some(8))
    );
    let cleared = UpdateGpuQuotaRequest {
        weight: None,
        lending_limit_gpus: None,
        ..update(32, true)
    };
    let quota = c
        .quotas
        .update_gpu_quota(cleared)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (quota.gpus, quota.weight, quota.lending_limit_gpus),
        (32, 1, None)
    );
    assert_eq!(
        c.quotas
            .get_gpu_quota(GetGpuQuotaRequest {
                id: quota.id.clone()
            })
            .await
            .unwrap()
            .into_inner(),
        quota
    );

    // Reservations: an active one.
    let t = now();
    let res = c
        .create_reservation(&tenant.id, "H100-80GB", 2, t - 60, t + 2 * HOUR)
        .await;
    assert_eq!(
        (res.status.as_str(), res.pool_nodes, res.on_demand_nodes),
        ("active", 2, 0)
    );
    let res = c
        .update_reservation(UpdateReservationRequest {
            end_time: ts(t + 3 * HOUR),
            ..Clients::reservation_update(&res.id)
        })
        .await;
    assert_eq!(res.end_time, ts(t + 3 * HOUR));

    // Clusters: one on the reservation, one from the pool.
    let train = c
        .create_cluster(Clients::cluster_on_reservation(
            &tenant.id,
            "train",
            "H100-80GB",
            2,
            &res.id,
        ))
        .await;
    assert_eq!(
        (train.status.as_str(), train.nodes.len(), train.storage_gib),
        ("running", 2, 100)
    );
    assert_eq!(
        train.endpoint,
        "https://train.team-a.k8s.gpufleet.internal:6443"
    );
    assert!(train
        .credentials
        .contains("server: https://train.team-a.k8s.gpufleet.internal:6443"));
    let mut slurm = Clients::cluster(&tenant.id, "hpc", "H100-80GB", 1);
    slurm.orchestrator = "slurm".into();
    let hpc = c.create_cluster(slurm).await;
    // A real Slurm cluster on this host: its login's port, and how to log in to it (the
    // cluster's own account, the login's host key), never its munge key.
    let (host, port) = hpc.endpoint.rsplit_once(':').expect("host:port");
    assert_eq!(host, "127.0.0.1");
    let creds: serde_json::Value = serde_json::from_str(&hpc.credentials).unwrap();
    assert_eq!(creds["port"].to_string(), port, "{creds:#}");
    assert!(creds["user"].as_str().is_some_and(|u| u.starts_with("gf")));
    assert!(creds["known_hosts"]
        .as_str()
        .is_some_and(|k| k.starts_with(&format!("[127.0.0.1]:{port} ssh-ed25519 "))));
    assert!(creds.get("munge_key").is_none(), "{creds:#}");
    let hpc = c
        .update_cluster(UpdateTenantClusterRequest {
            id: hpc.id.clone(),
            node_count: 2,
            storage_gib: 200,
            ..Default::default()
        })
        .await;
    assert_eq!((hpc.nodes.len(), hpc.storage_gib), (2, 200));
    let got = c.get_cluster(&hpc.id).await;
    assert_eq!(got, hpc);

    // Usage: 16 GPUs in the pool cluster, 16 reserved: the quota leaves 8, but the pool's
    // 4 nodes are all held, so nothing can be obtained now and capacity binds.
    let usage = c.usage(&tenant.id, "H100-80GB").await;
    assert_eq!((usage.used, usage.reserved, usage.quota_left), (16, 16, 8));
    assert_eq!((usage.capacity_free, usage.available), (0, 0));
    assert_eq!(usage.binding, "capacity");

    // Restart on the same data dir: nothing lost, the tenant token still works.
    let before = c.snapshot().await;
    drop(c);
    assert!(agent.stop().success(), "SIGTERM is a clean shutdown");
    let agent = Agent::start(&data);
    let mut c = agent.admin().await;
    c.assert_unchanged(&before, "a restart keeps every object")
        .await;
    let mut as_tenant = agent.clients(&token).await;
    let own = as_tenant
        .clusters
        .list_tenant_clusters(ListTenantClustersRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(own.clusters.len(), 2);

    // Tear down in dependency order.
    for id in [train.id, hpc.id] {
        c.delete_cluster(&id).await;
    }
    c.delete_reservation(&res.id).await;
    c.quotas
        .delete_gpu_quota(DeleteGpuQuotaRequest {
            id: quota.id,
            ..Default::default()
        })
        .await
        .unwrap();
    c.tenants
        .delete_tenant(DeleteTenantRequest {
            id: tenant.id,
            ..Default::default()
        })
        .await
        .unwrap();
    let nodes = c.nodes().await;
    assert!(
        nodes.iter().all(|n| n.cluster_id.is_empty()),
        "every node is free again"
    );
}

#[tokio::test]
async fn generated_admin_token_is_private_and_reused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agent = Agent::start_with(&data, &[]);
    let path = data.join("admin.token");
    let token = std::fs::read_to_string(&path).unwrap().trim().to_string();
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let mut c = agent.clients(&token).await;
    c.tenant("t1").await;
    drop(c);
    assert!(agent.stop().success());

    let agent = Agent::start_with(&data, &[]);
    assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), token);
    let mut c = agent.clients(&token).await;
    assert_eq!(c.tenant_count().await, 1);
}

#[tokio::test]
async fn a_retried_create_returns_the_first_object() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut c = agent.admin().await;

    let req = CreateTenantRequest {
        request_id: "r1".into(),
        name: "team-a".into(),
        ..Default::default()
    };
    let first = c
        .tenants
        .create_tenant(req.clone())
        .await
        .unwrap()
        .into_inner();
    let second = c
        .tenants
        .create_tenant(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.tenant, second.tenant);
    // The first response may have been lost: the retry issues a new token, the old one is revoked.
    assert_ne!(first.token, second.token);
    let mut old = agent.clients(&first.token).await;
    assert_status(
        old.tenants
            .list_tenants(ListTenantsRequest::default())
            .await,
        tonic::Code::Unauthenticated,
        "GPUFLEET_TOKEN",
    );
    let mut new = agent.clients(&second.token).await;
    assert_eq!(new.tenant_count().await, 1);
    let other = CreateTenantRequest {
        name: "team-b".into(),
        ..req
    };
    assert_status(
        c.tenants.create_tenant(other).await,
        tonic::Code::InvalidArgument,
        "request_id",
    );

    let tenant = first.tenant.unwrap();
    let q1 = c.quota(&tenant.id, "H100-80GB", 32, 32).await;
    let q2 = c.quota(&tenant.id, "H100-80GB", 32, 32).await;
    assert_eq!(q1, q2);

    let t = now();
    let r = Clients::reservation(&tenant.id, "H100-80GB", 1, t + HOUR, t + 2 * HOUR);
    let r1 = c.create_reservation_from(r.clone()).await;
    let r2 = c.create_reservation_from(r).await;
    assert_eq!(r1.id, r2.id);

    let k = Clients::cluster(&tenant.id, "k", "H100-80GB", 1);
    let k1 = c.create_cluster(k.clone()).await;
    let k2 = c.create_cluster(k).await;
    assert_eq!(k1, k2);

    assert_eq!(c.tenant_count().await, 1);
    assert_eq!(
        c.quotas
            .list_gpu_quotas(ListGpuQuotasRequest::default())
            .await
            .unwrap()
            .into_inner()
            .quotas
            .len(),
        1
    );
    let reservations = c
        .reservations
        .list_reservations(ListReservationsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reservations.reservations.len(), 1);
    let clusters = c
        .clusters
        .list_tenant_clusters(ListTenantClustersRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(clusters.clusters.len(), 1);
}

#[tokio::test]
async fn the_fleet_file_defines_the_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("fleet.toml");
    std::fs::write(
        &fleet,
        "[[pool]]\ngpu_type = \"A100-40GB\"\nnodes = 3\ngpus_per_node = 4\n",
    )
    .unwrap();
    let agent = Agent::start_with(
        &dir.path().join("data"),
        &["--admin-token", ADMIN, "--fleet", fleet.to_str().unwrap()],
    );
    let mut c = agent.admin().await;
    let nodes = c.nodes().await;
    let hosts: Vec<_> = nodes
        .iter()
        .map(|n| (n.hostname.as_str(), n.gpus.len()))
        .collect();
    assert_eq!(
        hosts,
        vec![
            ("a100-40gb-pool-01", 4),
            ("a100-40gb-pool-02", 4),
            ("a100-40gb-pool-03", 4)
        ]
    );

    std::fs::write(&fleet, "[[pool]]\ngpu_type = \"V100\"\nnodes = 1\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("other"))
        .arg("--fleet")
        .arg(&fleet)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown GPU model 'V100'") && err.contains("H100-80GB"),
        "{err}"
    );
}
