//! The probe's shape against the API's connection bounds (issue 40 N1): one local process
//! holds more connections than the per-peer cap (256; all of loopback is one peer), each
//! refused once for a token that is none. A Terraform plan and the CLI still get through:
//! past the cap, the oldest connection on which no caller proved who it is makes room.

use gpufleet_e2e::{hcl, Backend, Terraform};
use gpufleet_proto::v1::ListTenantsRequest;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_refused_loopback_connections_shut_out_neither_a_plan_nor_the_cli() {
    const HELD: usize = 300;
    let backend = Backend::start();
    let mut held = Vec::with_capacity(HELD);
    for _ in 0..HELD {
        let mut c = backend.clients("gft_not-a-token").await;
        let refused = c
            .tenants
            .list_tenants(ListTenantsRequest::default())
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
        held.push(c);
    }

    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(&hcl::config(&[hcl::tenant("speech", "speech")]));
    tf.init();
    tf.plan();
    let out = std::process::Command::new(gpufleet_e2e::binaries::agent())
        .arg("fleet")
        .env("GPUFLEET_ENDPOINT", backend.endpoint())
        .env("GPUFLEET_TOKEN", backend.admin_token())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gpufleet-agent fleet with {HELD} refused connections held: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(held);
}
