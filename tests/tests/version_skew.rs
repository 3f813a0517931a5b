//! Version skew between node agents and the control plane, tested without building an old
//! release: `tests/proto-previous/` is `proto/` as the previous release had it (compiled
//! by `tests/build.rs`). A client speaking it plays the previous release's agent against
//! this release's control plane (a real `serve`, over gRPC with mutual TLS); a server
//! speaking it plays the previous release's control plane to this release's agent (a real
//! `gpufleet-agent node`). Agents and control planes that claim a protocol too far from
//! this release's are refused at once, naming both versions, with nothing recorded; and
//! every field of the previous protocol keeps its number and type. The policy:
//! docs/operations.md, "Upgrades and version skew".

use std::pin::Pin;
use std::process::{Command, Stdio};
use std::time::Duration;

use gpufleet_e2e::{eventually, Backend, Clients};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tokio_stream::Stream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Request, Response, Status, Streaming};

/// The previous release's protocol, both files (its messages, clients and servers).
#[allow(clippy::all)]
mod previous {
    tonic::include_proto!("gpufleet.v1");
}

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(60);

/// What the simulated H100-80GB reports as its memory (NVML's figure).
const H100_MIB: i64 = 81559;

/// This release, as both ends name it.
fn ours() -> String {
    format!("release {} speaking protocol 2", env!("CARGO_PKG_VERSION"))
}

/// `gpufleet-agent pki --dir DIR --agent NAME...`, as an operator runs it.
fn pki(dir: &std::path::Path, agents: &[&str]) {
    let mut cmd = Command::new(gpufleet_e2e::binaries::agent());
    cmd.arg("pki").arg("--dir").arg(dir);
    for a in agents {
        cmd.args(["--agent", a]);
    }
    let out = cmd.output().expect("run gpufleet-agent pki");
    assert!(
        out.status.success(),
        "pki: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read(path: std::path::PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A control plane with mutual TLS (`--agent-ca`) whose fleet is whoever registers, and
/// the pki directory that holds the agents' certificates.
fn mtls_control_plane(agents: &[&str]) -> (Backend, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path(), agents);
    let ca = dir.path().join("ca.pem");
    let tls = gpufleet_e2e::ServerTls {
        ca_pem: read(ca.clone()),
        cert_pem: read(dir.path().join("server.pem")),
        key_pem: read(dir.path().join("server.key")),
    };
    let ca_arg = ca.display().to_string();
    let backend = Backend::start_with_tls_and_args(
        &tls,
        &["--node-agents", "external", "--agent-ca", &ca_arg],
    );
    (backend, dir)
}

/// A channel to `backend` as agent `name` (its certificate from `pki`).
async fn agent_channel(backend: &Backend, pki: &std::path::Path, name: &str) -> Channel {
    let endpoint = backend.endpoint();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(pki.join("ca.pem"))))
        .identity(Identity::from_pem(
            read(pki.join(format!("agent-{name}.pem"))),
            read(pki.join(format!("agent-{name}.key"))),
        ))
        .domain_name("127.0.0.1");
    Channel::from_shared(endpoint.clone())
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {endpoint}: {e:?}"))
}

fn auth(backend: &Backend) -> gpufleet_proto::BearerAuth {
    gpufleet_proto::BearerAuth::new(backend.join_token()).expect("a header-safe join token")
}

/// One whole H100 of the node `name`, in the previous protocol's words.
fn previous_gpus(name: &str) -> Vec<previous::Gpu> {
    vec![previous::Gpu {
        index: 0,
        uuid: format!("GPU-{name}-0"),
        model: "H100-80GB".into(),
        memory_mib: H100_MIB,
        ..Default::default()
    }]
}

/// The previous release's answer to `order`: a health check passed, any other order done
/// with the node's GPUs as they are.
fn previous_answer(name: &str, order: previous::WorkOrder) -> previous::OrderResult {
    use previous::work_order::Kind;
    let health = match &order.kind {
        Some(Kind::RunHealthCheck(check)) => Some(previous::HealthReport {
            level: check.level.clone(),
            checks: vec![previous::CheckResult {
                name: "gpu_count".into(),
                verdict: "pass".into(),
                value: "1".into(),
                ..Default::default()
            }],
            finished_at: 0,
        }),
        _ => None,
    };
    previous::OrderResult {
        order_id: order.id,
        ok: true,
        health,
        inventory: Some(previous::NodeInventory {
            gpu_type: "H100-80GB".into(),
            driver_version: "550.54.15".into(),
            cuda_version: "12.4".into(),
            gpus: previous_gpus(name),
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_previous_releases_agent_joins_this_control_plane_and_answers_its_orders() {
    let (backend, pki) = mtls_control_plane(&["old1"]);
    let channel = agent_channel(&backend, pki.path(), "old1").await;
    let mut client = previous::node_agent_service_client::NodeAgentServiceClient::with_interceptor(
        channel,
        auth(&backend),
    );
    // The previous release's registration: no release, no protocol.
    let (up, up_rx) = mpsc::unbounded_channel();
    up.send(previous::AgentMessage {
        msg: Some(previous::agent_message::Msg::Register(
            previous::RegisterNode {
                name: "old1".into(),
                capacity: "pool".into(),
                hardware: "sim".into(),
                inventory: Some(previous::NodeInventory {
                    gpu_type: "H100-80GB".into(),
                    driver_version: "550.54.15".into(),
                    cuda_version: "12.4".into(),
                    gpus: previous_gpus("old1"),
                }),
                ..Default::default()
            },
        )),
    })
    .unwrap();
    let mut down = client
        .session(UnboundedReceiverStream::new(up_rx))
        .await
        .unwrap_or_else(|s| panic!("the previous release's agent is refused: {s}"))
        .into_inner();
    let first = down
        .message()
        .await
        .expect("registered")
        .expect("an answer");
    let Some(previous::control_message::Msg::Registered(registered)) = first.msg else {
        panic!("expected Registered, got {first:?}");
    };
    assert_eq!(registered.node_id, "old1");
    assert!(registered.node_secret.starts_with("gfn_"));

    // Heartbeats as the previous release sends them, and every order answered.
    let beats = up.clone();
    let every = Duration::from_millis(u64::from(registered.heartbeat_interval_ms.max(50)));
    let heartbeats = tokio::spawn(async move {
        for seq in 1.. {
            tokio::time::sleep(every).await;
            let beat = previous::Heartbeat {
                seq,
                ..Default::default()
            };
            let msg = Some(previous::agent_message::Msg::Heartbeat(beat));
            if beats.send(previous::AgentMessage { msg }).is_err() {
                return;
            }
        }
    });
    let (answered_tx, mut answered) = mpsc::unbounded_channel::<String>();
    let answers = up.clone();
    let orders = tokio::spawn(async move {
        while let Ok(Some(message)) = down.message().await {
            if let Some(previous::control_message::Msg::Order(order)) = message.msg {
                let kind = format!("{:?}", order.kind).chars().take(200).collect();
                let msg = Some(previous::agent_message::Msg::Result(previous_answer(
                    "old1", order,
                )));
                let _ = answers.send(previous::AgentMessage { msg });
                let _ = answered_tx.send(kind);
            }
        }
    });
    // The control plane's admission checks are orders: answered, the node is ready.
    let first_order = tokio::time::timeout(LIMIT, answered.recv())
        .await
        .expect("an order within the limit")
        .expect("the session stays open");
    let mut admin = backend.admin().await;
    let ready = eventually("old1 ready", LIMIT, || {
        let mut admin = admin.clone();
        async move {
            admin
                .nodes()
                .await
                .into_iter()
                .find(|n| n.hostname == "old1" && n.state == "ready")
        }
    })
    .await;
    assert_eq!(ready.gpu_count, 1, "{ready:?}");
    assert!(
        backend
            .log()
            .contains("an unnamed release speaking protocol 1"),
        "the control plane logs the agent's version: {}",
        backend.log()
    );
    eprintln!("old1 answered {first_order}... and is ready");

    // Without shared storage its cluster's volume would be node-local, which this agent
    // cannot make: the create is refused naming both versions, and nothing is kept.
    let (tenant, _) = gpufleet_e2e::fixtures::create_tenant(&mut admin, "skew").await;
    gpufleet_e2e::fixtures::create_quota(&mut admin, &tenant.id, "H100-80GB", 1, 0).await;
    let refused = admin
        .clusters
        .create_tenant_cluster(gpufleet_proto::v1::CreateTenantClusterRequest {
            request_id: gpufleet_e2e::fixtures::request_id(),
            tenant_id: tenant.id.clone(),
            name: "train".into(),
            orchestrator: "kubernetes".into(),
            gpu_type: "H100-80GB".into(),
            node_count: 1,
            storage_gib: 10,
            ..Default::default()
        })
        .await
        .expect_err("a node-local volume on the previous release's agent is refused");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    for named in [
        "node old1's agent is an unnamed release speaking protocol 1",
        &format!("this control plane is {}", ours()),
        "upgrade the node agent, or run serve with --shared-storage",
    ] {
        assert!(refused.message().contains(named), "{named}: {refused}");
    }
    let clusters = admin
        .clusters
        .list_tenant_clusters(gpufleet_proto::v1::ListTenantClustersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .clusters;
    assert!(
        clusters.is_empty(),
        "nothing kept of the create: {clusters:?}"
    );
    let node = admin
        .nodes()
        .await
        .into_iter()
        .find(|n| n.hostname == "old1");
    let node = node.expect("old1 still known");
    assert_eq!(
        (node.state.as_str(), node.cluster_id.as_str()),
        ("ready", ""),
        "old1 is free and ready: {node:?}"
    );
    while let Ok(kind) = answered.try_recv() {
        assert!(!kind.contains("VolumeMount"), "no volume ordered: {kind}");
    }
    heartbeats.abort();
    orders.abort();
    drop(up);
    assert_eq!(admin.nodes().await.len(), 1);
}

/// A registration of this release's protocol, claiming `release` and `protocol`.
fn claiming(name: &str, release: &str, protocol: u32) -> gpufleet_proto::v1::RegisterNode {
    use gpufleet_proto::v1;
    v1::RegisterNode {
        name: name.into(),
        capacity: "pool".into(),
        hardware: "sim".into(),
        release: release.into(),
        protocol: Some(protocol),
        inventory: Some(v1::NodeInventory {
            gpu_type: "H100-80GB".into(),
            driver_version: "550.54.15".into(),
            cuda_version: "12.4".into(),
            gpus: vec![v1::Gpu {
                index: 0,
                uuid: format!("GPU-{name}-0"),
                model: "H100-80GB".into(),
                memory_mib: H100_MIB,
                ..Default::default()
            }],
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_of_a_protocol_too_new_or_too_old_is_refused_naming_both_versions_and_nothing_is_recorded(
) {
    use gpufleet_proto::v1::{self, node_agent_service_client::NodeAgentServiceClient};
    let (backend, pki) = mtls_control_plane(&["skewed"]);
    for (release, protocol, remedy) in [
        ("9.0.0", 4, "upgrade the control plane"),
        ("0.0.1", 0, "upgrade the agent"),
    ] {
        let channel = agent_channel(&backend, pki.path(), "skewed").await;
        let mut client = NodeAgentServiceClient::with_interceptor(channel, auth(&backend));
        let register = v1::AgentMessage {
            msg: Some(v1::agent_message::Msg::Register(claiming(
                "skewed", release, protocol,
            ))),
        };
        let refused = match client.session(tokio_stream::iter([register])).await {
            Err(status) => status,
            Ok(response) => response
                .into_inner()
                .message()
                .await
                .expect_err("a refusal, not a registration"),
        };
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
        let why = refused.message();
        let theirs = format!("this agent is release {release} speaking protocol {protocol}");
        assert!(
            why.starts_with("protocol: ")
                && why.contains(&theirs)
                && why.contains(&format!("this control plane is {}", ours()))
                && why.contains(remedy),
            "{why}"
        );
    }
    // Refused before anything was recorded.
    let mut admin: Clients = backend.admin().await;
    assert!(admin.nodes().await.is_empty());
}

type Sessions<M> = Pin<Box<dyn Stream<Item = Result<M, Status>> + Send>>;

/// The previous release's control plane, as far as one session goes: it registers the
/// agent, sends one order, and hands on everything the agent sends, decoded under the
/// previous protocol. A stream ends when the agent says it is leaving.
struct PreviousControlPlane {
    order: previous::WorkOrder,
    heard: mpsc::UnboundedSender<previous::agent_message::Msg>,
}

#[tonic::async_trait]
impl previous::node_agent_service_server::NodeAgentService for PreviousControlPlane {
    type SessionStream = Sessions<previous::ControlMessage>;

    async fn session(
        &self,
        request: Request<Streaming<previous::AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let mut inbound = request.into_inner();
        let (out, out_rx) = mpsc::unbounded_channel();
        let registered = previous::Registered {
            node_id: "new1".into(),
            heartbeat_interval_ms: 200,
            node_secret: "gfn_previous".into(),
        };
        let msg = Some(previous::control_message::Msg::Registered(registered));
        let _ = out.send(Ok(previous::ControlMessage { msg }));
        let msg = Some(previous::control_message::Msg::Order(self.order.clone()));
        let _ = out.send(Ok(previous::ControlMessage { msg }));
        let heard = self.heard.clone();
        tokio::spawn(async move {
            while let Ok(Some(previous::AgentMessage { msg: Some(msg) })) = inbound.message().await
            {
                let leaving = matches!(msg, previous::agent_message::Msg::Leaving(_));
                let _ = heard.send(msg);
                if leaving {
                    break;
                }
            }
            drop(out);
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(
            out_rx,
        ))))
    }
}

/// A control plane of this release's protocol that answers every registration with the
/// versions it is told to claim.
struct ClaimingControlPlane {
    release: &'static str,
    protocol: u32,
}

#[tonic::async_trait]
impl gpufleet_proto::v1::node_agent_service_server::NodeAgentService for ClaimingControlPlane {
    type SessionStream = Sessions<gpufleet_proto::v1::ControlMessage>;

    async fn session(
        &self,
        _request: Request<Streaming<gpufleet_proto::v1::AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        use gpufleet_proto::v1;
        let registered = v1::Registered {
            node_id: "new2".into(),
            heartbeat_interval_ms: 200,
            release: self.release.into(),
            protocol: Some(self.protocol),
            ..Default::default()
        };
        let msg = Some(v1::control_message::Msg::Registered(registered));
        // The stream stays open: the agent is the one to end it.
        let answers = tokio_stream::iter([Ok(v1::ControlMessage { msg })]);
        Ok(Response::new(Box::pin(tokio_stream::StreamExt::chain(
            answers,
            tokio_stream::pending(),
        ))))
    }
}

/// Serves `router` on a free loopback port until the test ends; its http:// endpoint.
async fn serve(router: tonic::transport::server::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(router.serve_with_incoming(TcpListenerStream::new(listener)));
    endpoint
}

/// `gpufleet-agent node` with one simulated H100 against `endpoint`; its data dir, log.
fn agent_against(endpoint: &str, name: &str, dir: &std::path::Path) -> std::process::Child {
    let log = std::fs::File::create(dir.join("node.log")).unwrap();
    Command::new(gpufleet_e2e::binaries::agent())
        .args(["node", "--control-plane", endpoint, "--name", name])
        .args(["--gpus", "1", "--data-dir"])
        .arg(dir.join("data"))
        .env("GPUFLEET_JOIN_TOKEN", "gfj_version_skew_test_token")
        .env_remove("GPUFLEET_HARDWARE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn gpufleet-agent node")
}

/// The exit status of `child` once it has ended within `limit` (None: it runs on).
fn exited(child: &mut std::process::Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("poll the node agent") {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// The next message the agent sent (within [`LIMIT`]).
async fn heard(
    from_agent: &mut mpsc::UnboundedReceiver<previous::agent_message::Msg>,
    what: &str,
) -> previous::agent_message::Msg {
    tokio::time::timeout(LIMIT, from_agent.recv())
        .await
        .unwrap_or_else(|_| panic!("no {what} within {LIMIT:?}"))
        .expect("the server runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_releases_agent_works_with_the_previous_releases_control_plane() {
    use previous::agent_message::Msg;
    let order = previous::WorkOrder {
        id: "order-1".into(),
        kind: Some(previous::work_order::Kind::ApplyMigLayout(
            previous::ApplyMigLayout {
                gpus: vec![previous::GpuLayout {
                    index: 0,
                    whole_gpu: false,
                    placements: vec![previous::MigPlacement {
                        profile: "7g.80gb".into(),
                        profile_id: 0,
                        start: 0,
                        size: 8,
                    }],
                }],
            },
        )),
    };
    let (hand_on, mut from_agent) = mpsc::unbounded_channel();
    let endpoint = serve(tonic::transport::Server::builder().add_service(
        previous::node_agent_service_server::NodeAgentServiceServer::new(PreviousControlPlane {
            order,
            heard: hand_on,
        }),
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut agent = agent_against(&endpoint, "new1", dir.path());
    let log = || std::fs::read_to_string(dir.path().join("node.log")).unwrap_or_default();
    // Its registration decodes under the previous protocol, as that control plane reads it.
    let Msg::Register(registration) = heard(&mut from_agent, "a registration").await else {
        panic!("the first message is not a registration");
    };
    assert_eq!(registration.name, "new1");
    assert_eq!(registration.capacity, "pool");
    let gpus = &registration.inventory.as_ref().expect("an inventory").gpus;
    assert_eq!((gpus.len(), gpus[0].model.as_str()), (1, "H100-80GB"));
    // Heartbeats, and the order carried out and answered in the previous protocol's words.
    let mut beats = 0;
    let result = loop {
        match heard(&mut from_agent, "the order's answer").await {
            Msg::Heartbeat(beat) => {
                beats += 1;
                assert_eq!(beat.seq, beats, "heartbeats count up");
            }
            Msg::Result(result) => break result,
            other => panic!("unexpected before the answer: {other:?}; {}", log()),
        }
    };
    assert!(result.ok, "{result:?}; {}", log());
    assert_eq!(result.order_id, "order-1");
    let gpu = &result
        .inventory
        .expect("the node's GPUs after the order")
        .gpus[0];
    assert!(gpu.mig_enabled, "{gpu:?}");
    let profiles: Vec<&str> = gpu.mig_devices.iter().map(|d| d.profile.as_str()).collect();
    assert_eq!(profiles, ["7g.80gb"]);
    assert!(
        log().contains("an unnamed release speaking protocol 1"),
        "the agent logs the control plane's version: {}",
        log()
    );
    // A planned stop: the previous protocol knows Leaving too, and the agent exits 0.
    let pid = agent.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    loop {
        match heard(&mut from_agent, "the agent's leave").await {
            Msg::Leaving(leaving) => {
                assert!(!leaving.reason.is_empty());
                break;
            }
            Msg::Heartbeat(_) => {}
            other => panic!("unexpected while leaving: {other:?}"),
        }
    }
    let status = exited(&mut agent, LIMIT).expect("the agent stops");
    assert!(status.success(), "{status:?}; {}", log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_releases_agent_leaves_a_control_plane_of_a_protocol_too_far_and_exits_refused() {
    let endpoint = serve(tonic::transport::Server::builder().add_service(
        gpufleet_proto::v1::node_agent_service_server::NodeAgentServiceServer::new(
            ClaimingControlPlane {
                release: "9.0.0",
                protocol: 4,
            },
        ),
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut agent = agent_against(&endpoint, "new2", dir.path());
    let status = exited(&mut agent, LIMIT).unwrap_or_else(|| {
        let _ = agent.kill();
        panic!("the agent runs on against a control plane of protocol 4")
    });
    let log = std::fs::read_to_string(dir.path().join("node.log")).unwrap_or_default();
    // EX_CONFIG: the unit's RestartPreventExitStatus, no restart loop.
    assert_eq!(status.code(), Some(78), "{log}");
    assert!(
        log.contains("protocol: this control plane is release 9.0.0 speaking protocol 4")
            && log.contains(&format!("this agent is {}", ours()))
            && log.contains("upgrade the agent"),
        "{log}"
    );
}

/// Every message, enum and method of the previous protocol, as (name, what it is); each
/// field as its number, name, type and label.
fn shapes(descriptors: &[u8]) -> std::collections::BTreeMap<String, String> {
    use prost_types::{DescriptorProto, FileDescriptorSet};
    fn message(
        prefix: &str,
        m: &DescriptorProto,
        out: &mut std::collections::BTreeMap<String, String>,
    ) {
        let name = format!("{prefix}.{}", m.name());
        out.insert(name.clone(), "message".into());
        for f in &m.field {
            let oneof = f.oneof_index.and_then(|i| m.oneof_decl.get(i as usize));
            // A field moved into or out of a oneof changes what the other end keeps.
            let oneof = oneof
                .map(|o| o.name().trim_start_matches('_'))
                .unwrap_or("");
            out.insert(
                format!("{name}#{}", f.number()),
                format!(
                    "{} {:?} {:?} {} {}",
                    f.name(),
                    f.r#type(),
                    f.label(),
                    f.type_name(),
                    if f.proto3_optional() { "" } else { oneof }
                ),
            );
        }
        for nested in &m.nested_type {
            message(&name, nested, out);
        }
    }
    let set = FileDescriptorSet::decode(descriptors).expect("a descriptor set");
    let mut out = std::collections::BTreeMap::new();
    for file in &set.file {
        let prefix = format!(".{}", file.package());
        for m in &file.message_type {
            message(&prefix, m, &mut out);
        }
        for e in &file.enum_type {
            for v in &e.value {
                out.insert(
                    format!("{prefix}.{}={}", e.name(), v.number()),
                    v.name().into(),
                );
            }
        }
        for s in &file.service {
            for m in &s.method {
                out.insert(
                    format!("{prefix}.{}/{}", s.name(), m.name()),
                    format!("{} -> {}", m.input_type(), m.output_type()),
                );
            }
        }
    }
    out
}

#[test]
fn every_field_of_the_previous_protocol_keeps_its_number_and_type() {
    let previous = shapes(include_bytes!(concat!(env!("OUT_DIR"), "/previous.fds")));
    let now = shapes(gpufleet_proto::DESCRIPTORS);
    let changed: Vec<String> = previous
        .iter()
        .filter(|(key, shape)| now.get(*key) != Some(shape))
        .map(|(key, shape)| format!("{key}: was {shape}, now {:?}", now.get(key)))
        .collect();
    assert!(
        changed.is_empty(),
        "the protocol must only gain fields: {changed:#?}"
    );
    assert!(previous.contains_key(".gpufleet.v1.RegisterNode#6"));
    // And this release's additions are new numbers, which the previous release skips.
    let register = gpufleet_proto::v1::RegisterNode {
        name: "n1".into(),
        release: "0.1.0".into(),
        protocol: Some(2),
        node_secret: "gfn_x".into(),
        ..Default::default()
    };
    let decoded = previous::RegisterNode::decode(register.encode_to_vec().as_slice()).unwrap();
    assert_eq!(
        (decoded.name.as_str(), decoded.node_secret.as_str()),
        ("n1", "gfn_x")
    );
}
