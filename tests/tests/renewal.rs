//! What a control plane run for years needs, done while node agents stay connected and a
//! cluster runs, never by restarting serve: its certificate renewed (`pki` again; serve
//! reloads the files, `--tls-reload-every`), an agent's certificate revoked (`pki
//! --revoke NAME`, `--agent-crl`: its session ends, its handshakes are refused) and
//! issued again, and the join token rotated with an overlap (`token rotate join`; agents
//! with `--join-token-file` pick the new one up at their next session).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpufleet_e2e::fixtures::{create_pool_cluster, create_quota, create_tenant};
use gpufleet_e2e::{eventually, Backend, Clients, NodeAgent, ServerTls};
use gpufleet_proto::v1::GetTenantClusterRequest;
use tokio_rustls::rustls::{self, pki_types::pem::PemObject, pki_types::CertificateDer};

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(60);

/// `gpufleet-agent ARGS...` as an operator runs it: its stdout.
fn run_agent(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = std::process::Command::new(gpufleet_e2e::binaries::agent());
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run gpufleet-agent");
    assert!(
        out.status.success(),
        "gpufleet-agent {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn pki(dir: &Path, args: &[&str]) {
    let mut all = vec!["pki", "--dir", dir.to_str().unwrap()];
    all.extend(args);
    run_agent(&all, &[]);
}

fn read(path: impl AsRef<Path>) -> String {
    let path = path.as_ref();
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The server certificate and CA as the pki directory holds them now.
fn server_tls(dir: &Path) -> ServerTls {
    ServerTls {
        ca_pem: read(dir.join("ca.pem")),
        cert_pem: read(dir.join("server.pem")),
        key_pem: read(dir.join("server.key")),
    }
}

fn der(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("a PEM certificate")
        .to_vec()
}

/// The certificate the server at `endpoint` presents to a new connection that trusts
/// `ca_pem`.
async fn served_certificate(endpoint: &str, ca_pem: &str) -> Vec<u8> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(der(ca_pem))).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let addr = endpoint.trim_start_matches("https://");
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("a TLS handshake with the control plane");
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

async fn node_states(admin: &mut Clients) -> Vec<(String, String)> {
    admin
        .nodes()
        .await
        .into_iter()
        .map(|n| (n.hostname, n.state))
        .collect()
}

async fn wait_state(admin: &Clients, name: &str, state: &str) {
    eventually(&format!("node {name} {state}"), LIMIT, || {
        let mut admin = admin.clone();
        async move {
            node_states(&mut admin)
                .await
                .iter()
                .any(|(n, s)| n == name && s == state)
                .then_some(())
        }
    })
    .await
}

fn agent_args(dir: &Path, name: &str) -> Vec<String> {
    let path = |f: String| dir.join(f).display().to_string();
    vec![
        "--gpus".into(),
        "1".into(),
        "--ca-cert".into(),
        path("ca.pem".into()),
        "--cert".into(),
        path(format!("agent-{name}.pem")),
        "--key".into(),
        path(format!("agent-{name}.key")),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_renew_and_revoke_while_agents_stay_connected_and_a_cluster_runs() {
    let pki_dir = tempfile::tempdir().unwrap();
    let dir = pki_dir.path();
    pki(dir, &["--agent", "n1", "--agent", "n2"]);
    let (ca, crl) = (dir.join("ca.pem"), dir.join("agents.crl"));
    let mut backend = Backend::start_with_tls_and_args(
        &server_tls(dir),
        &[
            "--node-agents",
            "external",
            "--agent-ca",
            ca.to_str().unwrap(),
            "--agent-crl",
            crl.to_str().unwrap(),
            "--tls-reload-every",
            "200ms",
        ],
    );
    let serve_pid = backend.pid();
    let n1_args = agent_args(dir, "n1");
    let n1 = NodeAgent::start(
        &backend,
        "n1",
        &n1_args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let n2_args = agent_args(dir, "n2");
    let mut n2 = NodeAgent::start(
        &backend,
        "n2",
        &n2_args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let mut admin = backend.admin().await;
    wait_state(&admin, "n1", "ready").await;
    wait_state(&admin, "n2", "ready").await;
    let (tenant, _) = create_tenant(&mut admin, "vision").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 1, 0).await;
    let cluster = create_pool_cluster(&mut admin, &tenant.id, "cv", "H100-80GB", 1).await;

    // Renewal: pki again issues a new server certificate from the same CA; the operator
    // puts it in place. New connections get it, without a restart.
    let before = served_certificate(&backend.endpoint(), &server_tls(dir).ca_pem).await;
    pki(dir, &[]);
    let renewed = server_tls(dir);
    assert_ne!(
        der(&renewed.cert_pem),
        before,
        "pki issued a new certificate"
    );
    backend.renew_tls(renewed.clone());
    let endpoint = backend.endpoint();
    eventually("the renewed certificate served", LIMIT, || {
        let (endpoint, ca, want) = (
            endpoint.clone(),
            renewed.ca_pem.clone(),
            der(&renewed.cert_pem),
        );
        async move { (served_certificate(&endpoint, &ca).await == want).then_some(()) }
    })
    .await;
    assert_eq!(backend.pid(), serve_pid, "serve was not restarted");
    let mut admin = backend.admin().await;
    let states = node_states(&mut admin).await;
    assert!(
        states.iter().all(|(_, s)| s == "ready" || s == "assigned"),
        "the agents stayed connected: {states:?}"
    );
    let running = admin
        .clusters
        .get_tenant_cluster(GetTenantClusterRequest {
            id: cluster.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(running.status, "running", "{running:?}");

    // Revocation: n2's certificate is revoked; its open session ends at the reload and
    // the agent stops, saying why; n1 is untouched.
    pki(dir, &["--revoke", "n2"]);
    let status = n2
        .wait_exit(LIMIT)
        .expect("the revoked agent's session ends");
    assert!(!status.success());
    assert!(n2.log().contains("revoked"), "{}", n2.log());
    wait_state(&admin, "n2", "unreachable").await;
    // At once and saying why, not after the node timeout as a missed heartbeat.
    let reason = admin
        .clone()
        .nodes()
        .await
        .into_iter()
        .find(|n| n.hostname == "n2")
        .map(|n| n.state_reason)
        .unwrap_or_default();
    assert!(reason.contains("certificate was revoked"), "{reason}");
    // Started again with the revoked certificate: refused at the handshake.
    let refusals = |log: &str| log.matches("could not register").count();
    let before = refusals(&n2.log());
    n2.restart();
    eventually(
        "the revoked certificate refused at the handshake",
        LIMIT,
        || {
            let log = n2.log();
            async move { (refusals(&log) > before).then_some(()) }
        },
    )
    .await;
    let states = node_states(&mut admin).await;
    assert!(
        states
            .iter()
            .any(|(n, s)| n == "n1" && (s == "ready" || s == "assigned")),
        "n1 untouched: {states:?}"
    );

    // A new certificate for n2: the agent, retrying, reads it at its next connection
    // and joins again, without being restarted.
    let retrying = n2.pid();
    pki(dir, &["--agent", "n2"]);
    wait_state(&admin, "n2", "ready").await;
    assert_eq!(n2.pid(), retrying, "the agent was not restarted");
    assert_eq!(backend.pid(), serve_pid, "serve was never restarted");
    drop(n1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_join_token_rotates_with_an_overlap_and_agents_with_a_token_file_follow() {
    let mut backend = Backend::start_generating_join_token(&[
        "--node-agents",
        "external",
        "--node-timeout",
        "5s",
    ]);
    let first = backend.generated_join_token();
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("join.token");
    std::fs::write(&token_file, format!("{first}\n")).unwrap();
    let file_arg = token_file.display().to_string();
    let n1 = NodeAgent::start_with_token(
        &backend,
        "n1",
        "",
        &["--gpus", "1", "--join-token-file", &file_arg],
    );
    let admin = backend.admin().await;
    wait_state(&admin, "n1", "ready").await;

    // Rotated with an hour's overlap: the old token still joins a new agent.
    let admin_env = [
        ("GPUFLEET_ENDPOINT", backend.endpoint()),
        ("GPUFLEET_TOKEN", backend.admin_token().to_string()),
    ];
    let env: Vec<(&str, &str)> = admin_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let second = run_agent(&["token", "rotate", "join", "--overlap", "1h"], &env)
        .trim()
        .to_string();
    assert!(second.starts_with("gfj_") && second != first, "{second}");
    assert_eq!(
        backend.generated_join_token(),
        second,
        "join.token holds the new secret"
    );
    let _n2 = NodeAgent::start_with_token(&backend, "n2", &first, &["--gpus", "1"]);
    wait_state(&admin, "n2", "ready").await;

    // Rotated again with no overlap: the second token is refused at once, saying so.
    let third = run_agent(&["token", "rotate", "join", "--overlap", "0s"], &env)
        .trim()
        .to_string();
    let mut n3 = NodeAgent::start_with_token(&backend, "n3", &second, &["--gpus", "1"]);
    assert!(!n3
        .wait_exit(LIMIT)
        .expect("a refused agent stops")
        .success());
    assert!(n3.log().contains("join token"), "{}", n3.log());

    // n1 follows its file: the operator writes the newest token there, serve restarts
    // (its agents reconnect), and n1 joins with it, never restarted itself. The first
    // token's overlap survives the restart.
    std::fs::write(&token_file, format!("{third}\n")).unwrap();
    let n1_pid = n1.pid();
    backend.restart();
    let admin = backend.admin().await;
    wait_state(&admin, "n1", "ready").await;
    assert_eq!(n1.pid(), n1_pid);
    let _n4 = NodeAgent::start_with_token(&backend, "n4", &first, &["--gpus", "1"]);
    wait_state(&admin, "n4", "ready").await;
    // The data dir keeps only hashes of retiring tokens.
    let retiring = read(backend.data_file("join.token.retiring"));
    assert!(
        !retiring.contains(&first) && !retiring.is_empty(),
        "{retiring}"
    );
}
