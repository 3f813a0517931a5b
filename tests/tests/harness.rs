//! The harness itself against the real backend: it starts, answers with the admin token,
//! refuses a wrong one, and keeps its data across a restart.

use gpufleet_e2e::fixtures::create_tenant;
use gpufleet_e2e::Backend;
use gpufleet_proto::v1::ListGpuTypesRequest;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_starts_with_the_default_fleet_and_survives_restart() {
    let mut backend = Backend::start();
    let mut admin = backend.admin().await;
    assert!(
        admin.inventory().await.is_empty(),
        "a fresh backend is empty"
    );

    let types = admin
        .fleet
        .list_gpu_types(ListGpuTypesRequest {})
        .await
        .expect("ListGpuTypes")
        .into_inner()
        .gpu_types;
    let pool = |name: &str| {
        types
            .iter()
            .find(|t| t.name == name)
            .map(|t| (t.pool_nodes, t.gpus_per_node))
    };
    assert_eq!(pool("H100-80GB"), Some((4, 8)));
    assert_eq!(pool("A100-80GB"), Some((2, 8)));
    assert_eq!(pool("H200-141GB"), Some((2, 8)));

    let (tenant, _token) = create_tenant(&mut admin, "survivor").await;
    backend.restart();
    let mut admin = backend.admin().await;
    let tenants = admin.inventory().await.tenants;
    assert_eq!(tenants, vec![tenant], "the tenant survives a restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_unauthenticated() {
    let backend = Backend::start();
    let mut stranger = backend.clients("not-a-token").await;
    let status = stranger
        .fleet
        .list_gpu_types(ListGpuTypesRequest {})
        .await
        .expect_err("a wrong token must be refused");
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status}");
}
