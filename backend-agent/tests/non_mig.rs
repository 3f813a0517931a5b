//! A model without MIG (L40S) end to end: a fleet file may hold it, its GPUs are whole,
//! and every MIG request on it is a clear INVALID_ARGUMENT that changes nothing.

mod common;

use common::*;
use gpufleet_proto::v1::*;
use tonic::Code;

const NO_MIG: &str =
    "mig_layout: L40S does not support MIG; leave mig_layout unset to use whole GPUs";

#[tokio::test]
async fn l40s_nodes_serve_whole_gpus_and_refuse_mig() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("fleet.toml");
    std::fs::write(
        &fleet,
        "[[pool]]\ngpu_type = \"L40S\"\nnodes = 2\ngpus_per_node = 4\n\n[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = 1\n",
    )
    .unwrap();
    let agent = Agent::start_with(
        &dir.path().join("data"),
        &["--admin-token", ADMIN, "--fleet", fleet.to_str().unwrap()],
    );
    let mut c = agent.admin().await;

    let types = c.gpu_types().await;
    let l40s = types
        .iter()
        .find(|t| t.name == "L40S")
        .expect("L40S listed");
    assert_eq!(
        (
            l40s.mig_capable,
            l40s.mig_profiles.len(),
            l40s.memory_mib,
            l40s.gpus_per_node,
            l40s.pool_nodes
        ),
        (false, 0, 46068, 4, 2)
    );

    let msg = assert_status(
        c.fleet
            .check_mig_layout(CheckMigLayoutRequest {
                gpu_type: "L40S".into(),
                layout: mig_layout(&[("1g.10gb", 1)]),
            })
            .await,
        Code::InvalidArgument,
        "",
    );
    assert_eq!(msg, NO_MIG);

    let (t, _) = c.tenant("team-a").await;
    c.quota(&t.id, "L40S", 8, 0).await;
    let before = c.snapshot().await;
    let mut mig = Clients::cluster(&t.id, "mig", "L40S", 1);
    mig.mig_layout = mig_layout(&[("1g.10gb", 1)]);
    let msg = assert_status(
        c.clusters.create_tenant_cluster(mig).await,
        Code::InvalidArgument,
        "",
    );
    assert_eq!(msg, NO_MIG);
    c.assert_unchanged(&before, "a refused create changes nothing")
        .await;

    let k = c.create_pool_cluster(&t.id, "k", "L40S", 2).await;
    assert_eq!(k.nodes.len(), 2);
    for g in k.nodes.iter().flat_map(|n| n.gpus.iter()) {
        assert_eq!(
            (g.model.as_str(), g.memory_mib, g.mig_enabled),
            ("L40S", 46068, false)
        );
        assert!(g.mig_devices.is_empty() && g.uuid.starts_with("GPU-"));
    }

    let before = c.snapshot().await;
    let msg = assert_status(
        c.clusters
            .update_tenant_cluster(UpdateTenantClusterRequest {
                id: k.id.clone(),
                mig_layout: mig_layout(&[("1g.10gb", 1)]),
                set_mig_layout: true,
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "",
    );
    assert_eq!(msg, NO_MIG);
    c.assert_unchanged(&before, "a refused update changes nothing")
        .await;
    // Whole GPUs stay whole GPUs: an empty layout is accepted.
    c.update_cluster(UpdateTenantClusterRequest {
        id: k.id.clone(),
        set_mig_layout: true,
        ..Default::default()
    })
    .await;
}

#[tokio::test]
async fn the_default_fleet_has_no_l40s() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut c = agent.admin().await;
    let names: Vec<String> = c.gpu_types().await.into_iter().map(|t| t.name).collect();
    assert_eq!(names, vec!["A100-80GB", "H100-80GB", "H200-141GB"]);
    // The catalog knows L40S, but a quota for a model the fleet does not have is refused.
    let (t, _) = c.tenant("team-a").await;
    let err = c
        .quotas
        .create_gpu_quota(gpufleet_proto::v1::CreateGpuQuotaRequest {
            request_id: "l40s".into(),
            tenant_id: t.id.clone(),
            gpu_type: "L40S".into(),
            gpus: 8,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().starts_with(
            "gpu_type: the fleet has no L40S nodes (it has A100-80GB, H100-80GB, H200-141GB)"
        ),
        "{}",
        err.message()
    );
}
