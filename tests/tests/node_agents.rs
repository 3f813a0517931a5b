//! Node agents as real processes: `serve --node-agents external` and `gpufleet-agent node`
//! processes on loopback. Registration and its refusals, MIG layouts applied by the
//! agents (each agent's own view checked), a killed agent's node replaced, an agent or
//! the control plane killed in the middle of an order, and mutual TLS.

use std::time::Duration;

use gpufleet_e2e::fixtures::{create_pool_cluster, create_quota, create_tenant};
use gpufleet_e2e::{eventually, hcl, Backend, Clients, NodeAgent, Terraform};
use gpufleet_proto::v1::{
    GetTenantClusterRequest, Node, TenantCluster, UpdateTenantClusterRequest,
};

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(60);

async fn nodes(admin: &mut Clients) -> Vec<Node> {
    admin.nodes().await
}

async fn ready_nodes(admin: &mut Clients, names: &[&str]) {
    let admin = admin.clone();
    // What the nodes were last seen as: said when they never get ready.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let last = seen.clone();
    let waited = tokio::time::timeout(
        LIMIT,
        eventually(&format!("nodes {names:?} ready"), LIMIT * 2, || {
            let (mut admin, seen) = (admin.clone(), seen.clone());
            async move {
                let all = admin.nodes().await;
                *seen.lock().unwrap() = all
                    .iter()
                    .map(|n| format!("{} {} ({})", n.hostname, n.state, n.state_reason))
                    .collect::<Vec<_>>()
                    .join("; ");
                names
                    .iter()
                    .all(|name| {
                        all.iter()
                            .any(|n| n.hostname == *name && n.state == "ready")
                    })
                    .then_some(())
            }
        }),
    )
    .await;
    assert!(
        waited.is_ok(),
        "nodes {names:?} not ready within {LIMIT:?}; last seen: {}",
        last.lock().unwrap()
    );
}

async fn cluster(admin: &mut Clients, id: &str) -> TenantCluster {
    admin
        .clusters
        .get_tenant_cluster(GetTenantClusterRequest { id: id.into() })
        .await
        .unwrap_or_else(|s| panic!("GetTenantCluster: {s}"))
        .into_inner()
}

fn layout(pairs: &[(&str, i32)]) -> std::collections::HashMap<String, i32> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// Every node is in at most one cluster, and each cluster holds exactly node_count nodes.
async fn assert_no_double_assignment(admin: &mut Clients) {
    let all = nodes(admin).await;
    for c in admin.inventory().await.clusters {
        let held = all.iter().filter(|n| n.cluster_id == c.id).count() as i64;
        assert_eq!(held, c.node_count, "cluster {} holds {held} nodes", c.name);
    }
}

/// Starts `change` and returns once the agent has journaled its order and not yet
/// answered it.
async fn update_in_flight(
    admin: &Clients,
    change: &UpdateTenantClusterRequest,
    agent: &NodeAgent,
) -> tokio::task::JoinHandle<Result<tonic::Response<TenantCluster>, tonic::Status>> {
    let update = {
        let mut admin = admin.clone();
        let change = change.clone();
        tokio::spawn(async move { admin.clusters.update_tenant_cluster(change).await })
    };
    eventually("the order under way", LIMIT, || {
        let journal = agent.journal();
        async move {
            journal?["orders"]
                .as_object()?
                .values()
                .any(|o| o["answer"].is_null())
                .then_some(())
        }
    })
    .await;
    update
}

const CLUSTER: &str = "gpufleet_tenant_cluster.train";

fn mig_cluster_config() -> String {
    hcl::config(&[
        hcl::tenant("t", "speech"),
        // Burst: guarantees may not exceed the agents' few GPUs.
        hcl::quota("h100", "gpufleet_tenant.t.id", "H100-80GB", 0).number("burst_gpus", 8),
        hcl::pool_cluster("train", "gpufleet_tenant.t.id", "train", "H100-80GB", 2)
            .expr("mig_layout", "{ \"3g.40gb\" = 2 }")
            .depends_on(&["gpufleet_gpu_quota.h100"]),
    ])
}

fn hostnames(cluster: &serde_json::Value) -> Vec<String> {
    cluster["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["hostname"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_apply_a_terraform_mig_layout_and_a_killed_node_is_replaced() {
    let backend = Backend::start_external("2s", "1s");
    let mut agents: Vec<NodeAgent> = ["n1", "n2", "n3"]
        .iter()
        .map(|name| NodeAgent::start(&backend, name, &["--gpus", "2"]))
        .collect();
    let mut admin = backend.admin().await;
    ready_nodes(&mut admin, &["n1", "n2", "n3"]).await;

    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(&mig_cluster_config());
    tf.init();
    tf.apply();
    let state = tf.resource(CLUSTER);
    let held = hostnames(&state);
    assert_eq!(held.len(), 2);
    // Each agent's own view of its GPUs shows the layout.
    let two_halves = vec![vec!["3g.40gb".to_string(); 2]; 2];
    for agent in agents.iter().filter(|a| held.contains(&a.name)) {
        assert_eq!(agent.profiles(), two_halves, "agent {}", agent.name);
    }
    tf.assert_no_changes();

    // The host of the first node dies.
    let cluster_id = state["id"].as_str().unwrap().to_string();
    let dead = held[0].clone();
    let spare = ["n1", "n2", "n3"]
        .into_iter()
        .find(|n| !held.iter().any(|h| h == n))
        .unwrap()
        .to_string();
    agents.iter_mut().find(|a| a.name == dead).unwrap().kill9();
    let degraded = eventually("the cluster degraded", LIMIT, || {
        let mut admin = admin.clone();
        let id = cluster_id.clone();
        async move {
            let c = cluster(&mut admin, &id).await;
            (c.status == "degraded").then_some(c)
        }
    })
    .await;
    // It says since when, why, and from when the node is replaced (1s later here).
    let reason = &degraded.status_reason;
    let since = reason
        .strip_prefix(&format!("node {dead} unreachable since "))
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("no since-time in {reason}"));
    let from = reason
        .split("it is replaced from ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("no replacement time in {reason}"));
    let at = |t: &str| {
        time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
            .unwrap_or_else(|e| panic!("{t}: {e}"))
    };
    assert_eq!(at(from) - at(since), time::Duration::seconds(1), "{reason}");
    assert!(reason.contains("(no heartbeat within 2s)"), "{reason}");
    // Replaced by the spare, which the agents partition like the others.
    let replaced = eventually("the node replaced", LIMIT, || {
        let mut admin = admin.clone();
        let id = cluster_id.clone();
        async move {
            let c = cluster(&mut admin, &id).await;
            (c.status == "running").then_some(c)
        }
    })
    .await;
    let now: Vec<&str> = replaced.nodes.iter().map(|n| n.hostname.as_str()).collect();
    assert!(
        now.contains(&spare.as_str()) && !now.contains(&dead.as_str()),
        "{now:?}"
    );
    let spare_agent = agents.iter().find(|a| a.name == spare).unwrap();
    assert_eq!(spare_agent.profiles(), two_halves);
    let dead_node = nodes(&mut admin)
        .await
        .into_iter()
        .find(|n| n.hostname == dead)
        .unwrap();
    assert_eq!(dead_node.state, "unreachable");
    assert!(
        dead_node.cluster_id.is_empty(),
        "the dead node left the cluster"
    );

    // `gpufleet-agent nodes` names the cluster as people do (TENANT/NAME), not by id.
    let listed = std::process::Command::new(gpufleet_e2e::binaries::agent())
        .args(["nodes", "--endpoint", &backend.endpoint()])
        .env("GPUFLEET_TOKEN", backend.admin_token())
        .output()
        .expect("run gpufleet-agent nodes");
    let text = String::from_utf8_lossy(&listed.stdout);
    let named = "speech/train";
    let spare_line = text
        .lines()
        .find(|l| l.starts_with(&format!("{spare} ")))
        .unwrap_or_else(|| panic!("{spare} not listed:\n{text}"));
    assert!(
        spare_line.contains(&format!(" {named} ")) && !text.contains(&cluster_id),
        "{text}"
    );

    // The cluster's history says what happened, node by node.
    let events = admin
        .fleet
        .list_events(gpufleet_proto::v1::ListEventsRequest {
            object_id: cluster_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events;
    let seen = |kind: &str, node: &str| events.iter().any(|e| e.kind == kind && e.node == node);
    assert!(held.iter().all(|h| seen("allocated", h)), "{events:#?}");
    assert!(
        seen("node_unreachable", &dead) && seen("node_replaced", &spare),
        "{events:#?}"
    );

    // Terraform reads the new node set; nothing to change.
    tf.assert_no_changes();
    tf.refresh();
    assert!(hostnames(&tf.resource(CLUSTER)).contains(&spare));

    // The dead host comes back: reset to whole GPUs and free, never in two clusters.
    agents
        .iter_mut()
        .find(|a| a.name == dead)
        .unwrap()
        .restart();
    ready_nodes(&mut admin, &[dead.as_str()]).await;
    let back = agents.iter().find(|a| a.name == dead).unwrap();
    assert_eq!(back.profiles(), vec![Vec::<String>::new(); 2]);
    let node = nodes(&mut admin)
        .await
        .into_iter()
        .find(|n| n.hostname == dead)
        .unwrap();
    assert!(node.cluster_id.is_empty());
    assert_no_double_assignment(&mut admin).await;

    tf.destroy();
    for agent in &agents {
        assert_eq!(
            agent.profiles(),
            vec![Vec::<String>::new(); 2],
            "{}",
            agent.name
        );
    }
}

/// A planned stop is not a crash: an agent stopped with SIGTERM tells the control plane,
/// so its cluster's node is `unreachable` at once with why (the node timeout here is 30s),
/// the cluster degraded naming it, and the agent exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_stopped_on_purpose_leaves_its_node_unreachable_at_once_saying_why() {
    let backend = Backend::start_external("30s", "5m");
    let mut agents: Vec<NodeAgent> = ["n1", "n2"]
        .iter()
        .map(|name| NodeAgent::start(&backend, name, &["--gpus", "1"]))
        .collect();
    let mut admin = backend.admin().await;
    ready_nodes(&mut admin, &["n1", "n2"]).await;
    let (tenant, _) = create_tenant(&mut admin, "vision").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 1, 0).await;
    let created = create_pool_cluster(&mut admin, &tenant.id, "cv", "H100-80GB", 1).await;
    let held = created.nodes[0].hostname.clone();
    let agent = agents.iter_mut().find(|a| a.name == held).unwrap();
    let stopped_at = std::time::Instant::now();
    agent.terminate();
    let status = agent.wait_exit(LIMIT).expect("the agent stops");
    assert!(status.success(), "{status:?}: {}", agent.log());
    assert!(
        agent
            .log()
            .contains("told the control plane this node is leaving"),
        "{}",
        agent.log()
    );
    let node = eventually("the node unreachable", LIMIT, || {
        let mut admin = admin.clone();
        let held = held.clone();
        async move {
            nodes(&mut admin)
                .await
                .into_iter()
                .find(|n| n.hostname == held && n.state == "unreachable")
        }
    })
    .await;
    eprintln!("unreachable {:?} after SIGTERM", stopped_at.elapsed());
    assert!(
        node.state_reason.contains("its agent stopped"),
        "not the node timeout's doing: {}",
        node.state_reason
    );
    let c = cluster(&mut admin, &created.id).await;
    assert_eq!(c.status, "degraded");
    assert!(
        c.status_reason
            .starts_with(&format!("node {held} unreachable since "))
            && c.status_reason.contains("(its agent stopped"),
        "{}",
        c.status_reason
    );

    // It comes back before it is replaced: the cluster runs again, and its log's last
    // word on the node says so (not `node_unreachable`).
    agents
        .iter_mut()
        .find(|a| a.name == held)
        .unwrap()
        .restart();
    eventually("the cluster running again", LIMIT, || {
        let mut admin = admin.clone();
        let id = created.id.clone();
        async move { (cluster(&mut admin, &id).await.status == "running").then_some(()) }
    })
    .await;
    let events = admin
        .fleet
        .list_events(gpufleet_proto::v1::ListEventsRequest {
            object_id: created.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events;
    let last = events.iter().rev().find(|e| e.node == held).unwrap();
    assert_eq!(last.kind, "node_reachable", "{events:#?}");
    assert!(
        last.message
            .contains(&format!("node {held} is reachable again")),
        "{}",
        last.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_tokens_taken_names_and_contradicting_hardware_are_refused() {
    let backend = Backend::start_external("30s", "5m");
    let mut admin = backend.admin().await;

    let mut forged = NodeAgent::start_with_token(&backend, "n9", "join-forged", &["--gpus", "2"]);
    let status = forged.wait_exit(LIMIT).expect("a refused agent exits");
    assert!(!status.success());
    assert!(forged.log().contains("join token"), "{}", forged.log());

    let _n1 = NodeAgent::start(&backend, "n1", &["--gpus", "2"]);
    ready_nodes(&mut admin, &["n1"]).await;
    // A second agent under a taken name is refused (and keeps trying, as an agent whose
    // own old session still looks live must).
    let mut twin = NodeAgent::start(&backend, "n1", &["--gpus", "2"]);
    eventually("the twin refused", LIMIT, || {
        let log = twin.log();
        async move { log.contains("held by a live agent").then_some(()) }
    })
    .await;
    twin.kill9();

    // Another host under the name, once the first agent is gone: the name is bound to
    // the host that first took it, so without that host's node secret it is refused.
    let secret = std::fs::read(_n1.data_dir().join("node.secret")).expect("n1 kept its secret");
    drop(_n1);
    let mut other = NodeAgent::start(&backend, "n1", &["--gpus", "4"]);
    // The old agent's stream may still look live for a moment (the agent keeps trying
    // then): wait until it is refused and exits.
    let refused = |other: &mut NodeAgent, why: &str| {
        for _ in 0..50 {
            let s = other.wait_exit(LIMIT).expect("exits");
            if other.log().contains(why) {
                return s;
            }
            other.restart();
        }
        panic!("never refused with {why:?}: {}", other.log());
    };
    assert!(!refused(&mut other, "node secret").success());
    // The same host (its secret) with other hardware: refused for the hardware.
    std::fs::write(other.data_dir().join("node.secret"), &secret).unwrap();
    other.restart();
    assert!(!refused(&mut other, "the agent reports 4").success());

    let all = nodes(&mut admin).await;
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(all[0].gpu_count, 2);
    assert!(all.iter().all(|n| n.hostname != "n9"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_order_answers_it_once_from_its_hardware() {
    let backend = Backend::start_external("30s", "5m");
    let mut agent = NodeAgent::start(&backend, "n1", &["--gpus", "2", "--sim-op-delay-ms", "150"]);
    let mut admin = backend.admin().await;
    ready_nodes(&mut admin, &["n1"]).await;
    let (tenant, _) = create_tenant(&mut admin, "vision").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 0, 8).await;
    let c = create_pool_cluster(&mut admin, &tenant.id, "slow", "H100-80GB", 1).await;

    let change = UpdateTenantClusterRequest {
        id: c.id.clone(),
        mig_layout: layout(&[("1g.10gb", 7)]),
        set_mig_layout: true,
        ..Default::default()
    };
    // The order is under way on the agent: journaled, not yet answered.
    let update = update_in_flight(&admin, &change, &agent).await;
    agent.restart();
    let answer = update.await.unwrap();
    let err = answer.expect_err("an order cut short fails");
    assert!(
        err.message().contains("stopped in the middle"),
        "{}",
        err.message()
    );

    // Every order ran at most once, and the control plane records what the agent has
    // (once the check that the failed change's node is back as recorded has answered).
    let journal = eventually("every order answered", LIMIT, || {
        let journal = agent.journal();
        async move {
            let journal = journal?;
            journal["orders"]
                .as_object()?
                .values()
                .all(|o| !o["answer"].is_null())
                .then_some(journal)
        }
    })
    .await;
    for (id, o) in journal["orders"].as_object().unwrap() {
        assert_eq!(o["runs"], 1, "order {id} ran more than once");
        assert!(!o["answer"].is_null(), "order {id} unanswered");
    }
    // The failed change is given back: the node ends as the cluster is, whole GPUs.
    let whole = vec![Vec::<String>::new(); 2];
    let now = eventually("the node back to whole GPUs", LIMIT, || {
        let (mut admin, id) = (admin.clone(), c.id.clone());
        let at_whole = agent.profiles() == whole;
        async move {
            let now = cluster(&mut admin, &id).await;
            let recorded_whole = now.nodes[0].gpus.iter().all(|g| g.mig_devices.is_empty());
            (at_whole && recorded_whole).then_some(now)
        }
    })
    .await;
    assert!(now.mig_layout.is_empty());

    // The same change again converges.
    let changed = admin
        .clusters
        .update_tenant_cluster(change)
        .await
        .unwrap_or_else(|s| panic!("update: {s}"))
        .into_inner();
    assert_eq!(changed.status, "running");
    assert_eq!(agent.profiles(), vec![vec!["1g.10gb".to_string(); 7]; 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_killed_mid_change_converges_after_restart() {
    let mut backend = Backend::start_external("30s", "5m");
    let agent = NodeAgent::start(&backend, "n1", &["--gpus", "2", "--sim-op-delay-ms", "100"]);
    let _spare = NodeAgent::start(&backend, "n2", &["--gpus", "2"]);
    let mut admin = backend.admin().await;
    ready_nodes(&mut admin, &["n1", "n2"]).await;
    let (tenant, _) = create_tenant(&mut admin, "audio").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 0, 16).await;
    let c = create_pool_cluster(&mut admin, &tenant.id, "asr", "H100-80GB", 1).await;
    assert_eq!(c.nodes[0].hostname, "n1");

    // Three times over, each with another layout: the control plane is killed while the
    // agent is half-way through the change and started again at once. A node left
    // half-way is a change to finish, never a fault: it is not quarantined.
    for (profile, count) in [("3g.40gb", 2), ("1g.10gb", 7), ("2g.20gb", 3)] {
        let change = UpdateTenantClusterRequest {
            id: c.id.clone(),
            mig_layout: layout(&[(profile, count)]),
            set_mig_layout: true,
            ..Default::default()
        };
        // The order is under way on the agent: journaled, not yet answered.
        let update = update_in_flight(&admin, &change, &agent).await;
        backend.crash();
        assert!(update.await.unwrap().is_err(), "the client lost its answer");
        backend.start_again();

        // The update is carried forward: the agents reconnect and converge.
        admin = backend.admin().await;
        let wanted = vec![vec![profile.to_string(); count as usize]; 2];
        let settled = eventually("the cluster settled", LIMIT, || {
            let mut admin = admin.clone();
            let id = c.id.clone();
            let profiles = agent.profiles();
            let wanted = wanted.clone();
            async move {
                let quarantined: Vec<String> = admin
                    .nodes()
                    .await
                    .into_iter()
                    .filter(|n| n.state == "quarantined")
                    .map(|n| format!("{}: {}", n.hostname, n.state_reason))
                    .collect();
                assert!(
                    quarantined.is_empty(),
                    "quarantined by a restart: {quarantined:?}"
                );
                let now = cluster(&mut admin, &id).await;
                let recorded: Vec<Vec<String>> = now.nodes[0]
                    .gpus
                    .iter()
                    .map(|g| g.mig_devices.iter().map(|d| d.profile.clone()).collect())
                    .collect();
                (now.status == "running"
                    && now.nodes[0].state == "ready"
                    && recorded == wanted
                    && profiles == wanted)
                    .then_some(now)
            }
        })
        .await;
        assert_eq!(settled.mig_layout, layout(&[(profile, count)]));
        // The same change again is a no-op that succeeds.
        let again = admin
            .clusters
            .update_tenant_cluster(change)
            .await
            .unwrap_or_else(|s| panic!("update: {s}"))
            .into_inner();
        assert_eq!(again.status, "running");
    }
    assert_no_double_assignment(&mut admin).await;
}

/// `gpufleet-agent pki --dir DIR --agent NAME...`, as an operator runs it.
fn pki(dir: &std::path::Path, agents: &[&str]) {
    let mut cmd = std::process::Command::new(gpufleet_e2e::binaries::agent());
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

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn read(path: std::path::PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_admits_only_agents_with_a_certificate_of_its_ca() {
    let ours = tempfile::tempdir().unwrap();
    let theirs = tempfile::tempdir().unwrap();
    pki(ours.path(), &["n1", "n3"]);
    pki(theirs.path(), &["n2"]);
    let ca = ours.path().join("ca.pem");
    let tls = gpufleet_e2e::ServerTls {
        ca_pem: read(ca.clone()),
        cert_pem: read(ours.path().join("server.pem")),
        key_pem: read(ours.path().join("server.key")),
    };
    let ca_arg = ca.display().to_string();
    let backend = Backend::start_with_tls_and_args(
        &tls,
        &["--node-agents", "external", "--agent-ca", &ca_arg],
    );
    let cert_args = |dir: &std::path::Path, name: &str| -> Vec<String> {
        vec![
            "--gpus".into(),
            "1".into(),
            "--ca-cert".into(),
            ca_arg.clone(),
            "--cert".into(),
            dir.join(format!("agent-{name}.pem")).display().to_string(),
            "--key".into(),
            dir.join(format!("agent-{name}.key")).display().to_string(),
        ]
    };
    let n1_args = cert_args(ours.path(), "n1");
    let _n1 = NodeAgent::start(&backend, "n1", &args(&n1_args));
    let mut admin = backend.admin().await;
    ready_nodes(&mut admin, &["n1"]).await;

    // A certificate from another CA fails the handshake: the agent never joins.
    let n2_args = cert_args(theirs.path(), "n2");
    let n2 = NodeAgent::start(&backend, "n2", &args(&n2_args));
    let n2_log = eventually("n2's failed handshake", LIMIT, || {
        let log = n2.log();
        async move { log.contains("could not register").then_some(log) }
    })
    .await;
    assert!(
        n2_log.contains("--agent-ca"),
        "the agent hints at the fix: {n2_log}"
    );
    // No certificate at all: refused by the control plane, and the agent says why.
    let mut n3 = NodeAgent::start(&backend, "n3", &["--gpus", "1", "--ca-cert", &ca_arg]);
    assert!(!n3
        .wait_exit(LIMIT)
        .expect("a refused agent exits")
        .success());
    assert!(n3.log().contains("client certificate"), "{}", n3.log());
    // A certificate names the one node it may register.
    let n1_as_n4 = cert_args(ours.path(), "n1");
    let mut n4 = NodeAgent::start(&backend, "n4", &args(&n1_as_n4));
    assert!(!n4
        .wait_exit(LIMIT)
        .expect("a refused agent exits")
        .success());
    assert!(n4.log().contains("is for node 'n1'"), "{}", n4.log());
    let names: Vec<String> = nodes(&mut admin)
        .await
        .into_iter()
        .map(|n| n.hostname)
        .collect();
    assert_eq!(names, vec!["n1".to_string()]);
}

#[test]
fn plain_http_on_a_network_address_needs_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(gpufleet_e2e::binaries::agent())
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env_remove("GPUFLEET_INSECURE")
        .output()
        .expect("run serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--listen") && err.contains("--insecure"),
        "{err}"
    );
    assert!(
        !dir.path().join("data").exists(),
        "nothing written before the refusal"
    );
}

#[test]
fn a_wildcard_listen_for_external_agents_needs_no_advertised_address() {
    // External agents' clusters run their controllers and logins on the nodes, at the
    // addresses the agents declare: serve has nothing of Slurm to advertise.
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut serve = std::process::Command::new(gpufleet_e2e::binaries::agent())
        .args([
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--insecure",
            "--node-agents",
            "external",
            "--data-dir",
        ])
        .arg(dir.path().join("data"))
        .env_remove("GPUFLEET_ADVERTISE_ADDRESS")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run serve");
    let mut line = String::new();
    std::io::BufReader::new(serve.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = serve.kill();
    let _ = serve.wait();
    assert!(
        line.starts_with("gpufleet-agent listening on http://0.0.0.0:"),
        "serve started: {line:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terraform_driver_change_rolls_through_agent_processes_and_a_restart_mid_install_is_no_rerun(
) {
    let backend = Backend::start_external("30s", "5m");
    // Installs take a while on these hosts, so one can be cut short.
    let slow = ["--gpus", "1", "--sim-op-delay-ms", "300"];
    let mut agents: Vec<NodeAgent> = ["n1", "n2"]
        .iter()
        .map(|name| NodeAgent::start(&backend, name, &slow))
        .collect();
    let mut admin = backend.admin().await;
    ready_nodes(&mut admin, &["n1", "n2"]).await;
    let config = |driver: &str| {
        hcl::config(&[
            hcl::tenant("t", "speech"),
            hcl::quota("h100", "gpufleet_tenant.t.id", "H100-80GB", 2),
            hcl::pool_cluster("train", "gpufleet_tenant.t.id", "train", "H100-80GB", 2)
                .string("driver_version", driver)
                .depends_on(&["gpufleet_gpu_quota.h100"]),
        ])
    };
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(&config("550.54.15"));
    tf.init();
    tf.apply();
    for a in &agents {
        assert_eq!(a.driver().as_deref(), Some("550.54.15"), "{}", a.name);
    }

    // Roll 570.133.20 through both hosts; n1's agent is killed while it installs.
    tf.write_main(&config("570.133.20"));
    let first = std::thread::scope(|s| {
        let apply = s.spawn(|| tf.run(&["apply", "-auto-approve", "-input=false", "-no-color"]));
        gpufleet_e2e::node_agent::wait_for("n1 installing", LIMIT, || {
            agents[0].journal()?["orders"]
                .as_object()?
                .values()
                .any(|o| o["answer"].is_null() && o["driver"] == "570.133.20")
                .then_some(())
        });
        agents[0].restart();
        apply.join().unwrap()
    });
    // The cut-short install was settled from the host's state (never run twice) and
    // ordered again under a new id: the apply went through.
    assert_eq!(first.code, 0, "{first}");
    let journal = agents[0].journal().unwrap();
    let installs: Vec<&serde_json::Value> = journal["orders"]
        .as_object()
        .unwrap()
        .values()
        .filter(|o| o["driver"] == "570.133.20")
        .collect();
    assert_eq!(
        installs.len(),
        2,
        "the cut-short order and its successor: {journal:#}"
    );
    for o in &installs {
        assert_eq!(o["runs"], 1, "an order ran twice: {o:#}");
    }
    assert!(installs
        .iter()
        .any(|o| o["answer"]["error_kind"] == "interrupted"));
    let mut admin = backend.admin().await;
    ready_nodes(&mut admin, &["n1", "n2"]).await;
    tf.assert_no_changes();
    tf.refresh();
    let state = tf.resource(CLUSTER);
    assert_eq!(state["driver_version"], "570.133.20");
    for node in state["nodes"].as_array().unwrap() {
        let agent = agents
            .iter()
            .find(|a| node["hostname"] == a.name.as_str())
            .expect("a node of an agent");
        assert_eq!(
            agent.driver().as_deref(),
            Some("570.133.20"),
            "{}",
            agent.name
        );
    }
    assert_no_double_assignment(&mut admin).await;
}
