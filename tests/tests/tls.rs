//! The provider against a backend served over TLS (`serve --tls-cert/--tls-key`): with the
//! right CA in `ca_cert_pem` a tenant is created, planned unchanged and destroyed; with
//! another CA, one diagnostic says so and nothing is created.

use gpufleet_e2e::hcl;
use gpufleet_e2e::{Backend, ServerTls, Terraform};

/// A provider block that reads the CA from `ca.pem` in the working directory.
const PROVIDER_WITH_CA_FILE: &str =
    "provider \"gpufleet\" {\n  ca_cert_pem = file(\"ca.pem\")\n}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_lifecycle_over_tls_with_ca_cert_pem() {
    let tls = ServerTls::generate("gpufleet");
    let backend = Backend::start_with_tls(&tls);
    assert!(backend.endpoint().starts_with("https://127.0.0.1:"));
    let mut tf = Terraform::new(&backend, backend.admin_token());
    // The CA comes from the provider block, not the environment.
    tf.set_ca_cert_pem(None);
    tf.write_file("ca.pem", &tls.ca_pem);
    tf.write_main(&format!(
        "{PROVIDER_WITH_CA_FILE}\n{}",
        hcl::config(&[hcl::tenant("t", "team-tls")])
    ));
    tf.init();

    tf.apply();
    let tenants = backend.admin().await.inventory().await.tenants;
    assert_eq!(
        tenants.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["team-tls"]
    );
    assert_eq!(
        tf.plan_detailed_exitcode(),
        0,
        "nothing to change after apply"
    );

    tf.destroy();
    assert!(backend.admin().await.inventory().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_ca_is_one_diagnostic_and_nothing_is_created() {
    let backend = Backend::start_with_tls(&ServerTls::generate("gpufleet"));
    let other_ca = ServerTls::generate("other").ca_pem;
    let mut tf = Terraform::new(&backend, backend.admin_token());
    // GPUFLEET_CA_CERT_PEM with a CA that did not sign the backend's certificate.
    tf.set_ca_cert_pem(Some(&other_ca));
    tf.write_main(&hcl::config(&[hcl::tenant("t", "team-tls")]));
    tf.init();

    let apply = tf.apply_fails();
    let output = apply.output();
    assert_eq!(
        output.matches("Error:").count(),
        1,
        "one diagnostic\n{apply}"
    );
    apply.assert_mentions(&[
        &format!(
            "TLS handshake with the gpufleet backend at {} failed: the server's certificate is not signed by ca_cert_pem",
            backend.endpoint()
        ),
        "GPUFLEET_CA_CERT_PEM",
    ]);
    for stack_text in [
        "transport error",
        "UnknownIssuer",
        "tonic",
        "hyper",
        "Caused by",
    ] {
        assert!(
            !output.contains(stack_text),
            "leaks {stack_text:?}\n{apply}"
        );
    }
    assert!(tf.state_list().is_empty(), "nothing reached state");
    assert!(backend.admin().await.inventory().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_endpoint_of_a_plain_http_backend_is_one_diagnostic() {
    let backend = Backend::start();
    let endpoint = backend.endpoint().replacen("http://", "https://", 1);
    let mut tf = Terraform::detached(&endpoint, backend.admin_token());
    tf.set_ca_cert_pem(Some(&ServerTls::generate("gpufleet").ca_pem));
    tf.write_main(&hcl::config(&[hcl::tenant("t", "team-tls")]));
    tf.init();

    let apply = tf.apply_fails();
    assert_eq!(
        apply.output().matches("Error:").count(),
        1,
        "one diagnostic\n{apply}"
    );
    apply.assert_mentions(&[&format!(
        "TLS handshake with the gpufleet backend at {endpoint} failed: the server did not answer with TLS"
    )]);
    assert!(backend.admin().await.inventory().await.is_empty());
}

/// The guide's pki, as an operator runs it: a server certificate for the control plane's
/// network name still holds the local names, so the admin commands on its own host work
/// over https; and an admin command given http:// for a TLS control plane says it speaks
/// https instead of "broken pipe".
#[test]
fn the_pkis_certificate_keeps_the_local_names_and_plain_http_is_told_https() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    let out = std::process::Command::new(gpufleet_e2e::binaries::agent())
        .args(["pki", "--dir"])
        .arg(&pki)
        .args(["--server-name", "cp.example.internal", "--agent", "gpu-a"])
        .output()
        .expect("run pki");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = |f: &str| std::fs::read_to_string(pki.join(f)).unwrap();
    let tls = ServerTls {
        ca_pem: read("ca.pem"),
        cert_pem: read("server.pem"),
        key_pem: read("server.key"),
    };
    let backend = Backend::start_with_tls(&tls);
    let port = backend.endpoint().rsplit(':').next().unwrap().to_string();
    let nodes = |endpoint: &str| {
        std::process::Command::new(gpufleet_e2e::binaries::agent())
            .args(["nodes", "--endpoint", endpoint, "--ca-cert"])
            .arg(pki.join("ca.pem"))
            .env("GPUFLEET_TOKEN", backend.admin_token())
            .output()
            .expect("run nodes")
    };
    for host in ["127.0.0.1", "localhost"] {
        let out = nodes(&format!("https://{host}:{port}"));
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).starts_with("HOSTNAME"),
            "{host}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = nodes(&format!("http://127.0.0.1:{port}"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "the control plane at 127.0.0.1:{port} speaks https, not http; use --endpoint https://127.0.0.1:{port}"
        )),
        "{err}"
    );
}
