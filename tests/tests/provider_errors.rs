//! Connection problems reach the user as one diagnostic that says what is wrong and which
//! setting fixes it, never as a chain of gRPC transport text.

use std::net::TcpListener;

use gpufleet_e2e::hcl::{self, Block};
use gpufleet_e2e::{Backend, Terraform, TfRun};

/// Words of the gRPC/HTTP stack that must not leak into a diagnostic.
const STACK_TEXT: &[&str] = &[
    "transport error",
    "tonic",
    "hyper",
    "h2 protocol",
    "Caused by",
    "status: Unavailable",
    "status: Unauthenticated",
    "error trying to connect",
    "tcp connect error",
];

/// A data source: read at plan time.
fn data_source() -> String {
    hcl::config(&[Block::data("gpufleet_gpu_types", "all")])
}

/// A resource alone: the backend is first needed when it is created at apply.
fn resource() -> String {
    hcl::config(&[hcl::tenant("t", "team")])
}

/// Asserts that `run` failed with exactly one error, mentioning every one of `needles`
/// and none of the stack's words.
fn assert_one_clear_error(run: &TfRun, needles: &[&str]) {
    let output = run.output();
    assert_eq!(
        output.matches("Error:").count(),
        1,
        "expected one diagnostic\n{run}"
    );
    run.assert_mentions(needles);
    for word in STACK_TEXT {
        assert!(
            !output.to_lowercase().contains(&word.to_lowercase()),
            "the diagnostic leaks {word:?}\n{run}"
        );
    }
}

/// `http://127.0.0.1:<port>` where nothing listens: a port the OS just handed out and that
/// was closed again.
fn closed_endpoint() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    let port = listener.local_addr().expect("local address").port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

#[test]
fn unreachable_backend_is_one_diagnostic_naming_the_endpoint_and_the_fix() {
    let endpoint = closed_endpoint();
    let tf = Terraform::detached(&endpoint, "any-token");
    tf.write_main(&data_source());
    tf.init();

    let plan = tf.plan_fails();
    assert_one_clear_error(
        &plan,
        &["cannot reach", &endpoint, "endpoint", "GPUFLEET_ENDPOINT"],
    );
    tf.write_main(&resource());
    let apply = tf.apply_fails();
    assert_one_clear_error(&apply, &["cannot reach", &endpoint, "GPUFLEET_ENDPOINT"]);
    assert!(tf.state_list().is_empty(), "nothing reached state");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_token_is_one_diagnostic_saying_to_set_the_token() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, "not-a-token");
    tf.write_main(&data_source());
    tf.init();

    let plan = tf.plan_fails();
    assert_one_clear_error(&plan, &["token", "GPUFLEET_TOKEN"]);
    assert_eq!(
        plan.output().matches("GPUFLEET_TOKEN").count(),
        1,
        "the fix is said once\n{plan}"
    );
    assert!(
        !plan.output().contains("not-a-token"),
        "the diagnostic must not echo the token\n{plan}"
    );
    tf.write_main(&resource());
    let apply = tf.apply_fails();
    assert_one_clear_error(&apply, &["token", "GPUFLEET_TOKEN"]);
    assert!(backend.admin().await.inventory().await.is_empty());
}
