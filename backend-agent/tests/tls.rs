//! `serve --tls-cert/--tls-key`: gRPC over TLS for clients that trust the CA, nothing for
//! plain-http clients or clients with another CA, and start-up errors that name the flag.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Agent, ADMIN};
use gpufleet_proto::v1::{fleet_service_client::FleetServiceClient, ListGpuTypesRequest};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

/// A CA and a server certificate it signed for `localhost` and 127.0.0.1, as PEM files.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

/// A self-signed CA: its PEM certificate, and the certificate and key to sign with.
fn new_ca(name: &str) -> (rcgen::Certificate, KeyPair) {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    (params.self_signed(&key).expect("self-sign the CA"), key)
}

fn new_pki(dir: &Path, name: &str) -> Pki {
    let (ca, ca_key) = new_ca(&format!("{name} test CA"));
    let key = KeyPair::generate().expect("server key");
    let params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .expect("server params");
    let cert = params
        .signed_by(&key, &ca, &ca_key)
        .expect("sign the server cert");
    let write = |file: &str, pem: String| {
        let path = dir.join(format!("{name}-{file}"));
        std::fs::write(&path, pem).expect("write PEM");
        path
    };
    Pki {
        ca: write("ca.pem", ca.pem()),
        cert: write("cert.pem", cert.pem()),
        key: write("key.pem", key.serialize_pem()),
    }
}

fn start_tls(dir: &Path, pki: &Pki) -> Agent {
    let (cert, key) = (pki.cert.to_str().unwrap(), pki.key.to_str().unwrap());
    Agent::start_with(
        &dir.join("data"),
        &["--admin-token", ADMIN, "--tls-cert", cert, "--tls-key", key],
    )
}

/// ListGpuTypes through `channel` with the admin token: the number of GPU types.
async fn gpu_types(channel: Channel) -> Result<usize, tonic::Status> {
    let mut client = FleetServiceClient::new(channel);
    let mut request = tonic::Request::new(ListGpuTypesRequest {});
    request.metadata_mut().insert(
        gpufleet_proto::AUTHORIZATION,
        gpufleet_proto::bearer(ADMIN).parse().unwrap(),
    );
    Ok(client
        .list_gpu_types(request)
        .await?
        .into_inner()
        .gpu_types
        .len())
}

/// A channel to `endpoint` that trusts `ca` and checks the certificate names `host`.
async fn tls_channel(
    endpoint: &str,
    ca: &Path,
    host: &str,
) -> Result<Channel, tonic::transport::Error> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()))
        .domain_name(host);
    Channel::from_shared(endpoint.to_string())
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await
}

#[tokio::test]
async fn tls_serve_answers_clients_that_trust_the_ca_only() {
    let dir = tempfile::tempdir().unwrap();
    let pki = new_pki(dir.path(), "right");
    let other = new_pki(dir.path(), "other");
    let agent = start_tls(dir.path(), &pki);
    let address = agent
        .endpoint
        .strip_prefix("https://")
        .unwrap_or_else(|| panic!("listening line is not https: {}", agent.endpoint))
        .to_string();
    let port = address.rsplit(':').next().unwrap();

    // Both names in the certificate work: the IP the agent listens on, and localhost.
    for (endpoint, host) in [
        (agent.endpoint.clone(), "127.0.0.1"),
        (format!("https://localhost:{port}"), "localhost"),
    ] {
        let channel = tls_channel(&endpoint, &pki.ca, host)
            .await
            .expect("TLS connect");
        assert!(gpu_types(channel).await.expect("ListGpuTypes over TLS") > 0);
    }

    // A plain-http client gets no answer.
    let plain = async {
        let channel = Channel::from_shared(format!("http://{address}"))
            .unwrap()
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        gpu_types(channel).await.map_err(|s| s.to_string())
    };
    assert!(
        plain.await.is_err(),
        "a plain-http client must not be served"
    );

    // A client that trusts another CA refuses the server.
    let wrong_ca = async {
        let channel = tls_channel(&agent.endpoint, &other.ca, "127.0.0.1")
            .await
            .map_err(|e| format!("{e:?}"))?;
        gpu_types(channel).await.map_err(|s| format!("{s:?}"))
    };
    let err = wrong_ca.await.expect_err("another CA must not be trusted");
    assert!(err.contains("UnknownIssuer"), "{err}");

    // The failed handshakes did not stop the server.
    let channel = tls_channel(&agent.endpoint, &pki.ca, "127.0.0.1")
        .await
        .unwrap();
    assert!(gpu_types(channel).await.unwrap() > 0);
    drop(agent);
}

#[test]
fn admin_client_uses_ca_cert_for_https() {
    let dir = tempfile::tempdir().unwrap();
    let pki = new_pki(dir.path(), "right");
    let agent = start_tls(dir.path(), &pki);
    let fleet = |ca: Option<&Path>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"));
        command
            .args(["fleet", "--endpoint", &agent.endpoint, "--token", ADMIN])
            .env_remove("GPUFLEET_CA_CERT");
        if let Some(ca) = ca {
            command.arg("--ca-cert").arg(ca);
        }
        command.output().expect("run gpufleet-agent fleet")
    };
    let out = fleet(Some(&pki.ca));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("GPU TYPE"));
    let out = fleet(None);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--ca-cert: missing"), "{stderr}");
}

/// `serve` with `args` must exit with an error whose text contains `needle`.
fn assert_start_fails(dir: &Path, args: &[&str], needle: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .args(args)
        .env_remove("GPUFLEET_TLS_CERT")
        .env_remove("GPUFLEET_TLS_KEY")
        .output()
        .expect("run gpufleet-agent serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "serve {args:?} must fail; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        out.stdout.is_empty(),
        "no listening line when TLS cannot start"
    );
    assert!(
        stderr.contains(needle),
        "serve {args:?}: expected {needle:?} in:\n{stderr}"
    );
}

#[test]
fn bad_tls_files_fail_at_start_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let pki = new_pki(dir.path(), "right");
    let other = new_pki(dir.path(), "other");
    let (cert, key) = (pki.cert.to_str().unwrap(), pki.key.to_str().unwrap());
    let missing = dir.path().join("missing.pem");
    let missing = missing.to_str().unwrap();

    assert_start_fails(dir.path(), &["--tls-cert", cert], "--tls-key: missing");
    assert_start_fails(dir.path(), &["--tls-key", key], "--tls-cert: missing");
    assert_start_fails(
        dir.path(),
        &["--tls-cert", missing, "--tls-key", key],
        "--tls-cert: cannot read",
    );
    assert_start_fails(
        dir.path(),
        &["--tls-cert", cert, "--tls-key", missing],
        "--tls-key: cannot read",
    );
    // The key in place of the certificate, and the reverse.
    assert_start_fails(
        dir.path(),
        &["--tls-cert", key, "--tls-key", key],
        "--tls-cert:",
    );
    assert_start_fails(
        dir.path(),
        &["--tls-cert", cert, "--tls-key", cert],
        "--tls-key:",
    );
    // A key that belongs to another certificate.
    let other_key = other.key.to_str().unwrap();
    assert_start_fails(
        dir.path(),
        &["--tls-cert", cert, "--tls-key", other_key],
        "--tls-cert/--tls-key:",
    );
}
