//! The automatic-quarantine breaker: failing checks quarantine at most the cap of one GPU
//! model's nodes per window; past it the breaker opens (an event, a metric), the failed
//! nodes stay in service with the failure reported, and only an operator's reset closes
//! it. The window runs on the file clock, so nothing here sleeps to move time.

mod common;

use common::*;
use gpufleet_proto::v1::*;
use tonic::Code;

const POOL: usize = 5;

fn hosts() -> Vec<String> {
    (1..=POOL)
        .map(|i| format!("h100-80gb-pool-{i:02}"))
        .collect()
}

/// Every GPU of `nodes` reports uncorrected ECC errors at every check from now on.
fn break_nodes(data: &std::path::Path, nodes: &[String]) {
    let faults: String = nodes
        .iter()
        .map(|n| format!("[[ecc_burst]]\nnode = \"{n}\"\ngpu = 0\nuncorrected = 3\n"))
        .collect();
    std::fs::write(data.join("sim-faults.toml"), faults).unwrap();
}

async fn node_states(admin: &mut Clients) -> Vec<(String, String)> {
    admin
        .nodes_of("H100-80GB")
        .await
        .into_iter()
        .map(|n| (n.hostname, n.state))
        .collect()
}

fn quarantined(states: &[(String, String)]) -> Vec<String> {
    states
        .iter()
        .filter(|(_, s)| s == "quarantined")
        .map(|(h, _)| h.clone())
        .collect()
}

fn breaker_open_metric(text: &str) -> Option<&str> {
    text.lines()
        .find(|l| l.starts_with("gpufleet_quarantine_breaker_open{gpu_type=\"H100-80GB\"}"))
        .and_then(|l| l.split_whitespace().last())
}

async fn check(tenant: &mut Clients, cluster_id: &str) -> ClusterHealthReport {
    tenant
        .health
        .run_health_check(RunHealthCheckRequest {
            cluster_id: cluster_id.into(),
            level: "quick".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

async fn events(admin: &mut Clients, object: &str) -> Vec<Event> {
    admin
        .fleet
        .list_events(ListEventsRequest {
            object_id: object.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events
}

#[tokio::test]
async fn failing_checks_quarantine_at_most_the_cap_then_the_breaker_holds_until_an_operator_resets_it(
) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let clock = dir.path().join("clock");
    let t0 = now();
    std::fs::write(&clock, t0.to_string()).unwrap();
    let fleet = dir.path().join("fleet.toml");
    std::fs::write(
        &fleet,
        format!("[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = {POOL}\n"),
    )
    .unwrap();
    let agent = Agent::start_with(
        &data,
        &[
            "--admin-token",
            ADMIN,
            "--fleet",
            fleet.to_str().unwrap(),
            "--clock-file",
            clock.to_str().unwrap(),
            "--health-interval",
            "0",
            "--breaker-window",
            "10m",
            "--breaker-max-quarantines",
            "2",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    let mut admin = agent.admin().await;
    let (team, token) = admin.tenant("team-a").await;
    admin.quota(&team.id, "H100-80GB", 8 * POOL as i64, 0).await;
    let mut tenant = agent.clients(&token).await;
    let cluster = tenant
        .clusters
        .create_tenant_cluster(Clients::cluster(&team.id, "train", "H100-80GB", 1))
        .await
        .unwrap()
        .into_inner();
    let metrics = metrics_addr(&agent);
    assert_eq!(breaker_open_metric(&scrape(&agent, &metrics)), Some("0"));

    // Every node of the model now fails its checks (what a threshold or a fault that no
    // node is to blame for looks like): the team's check takes out two, and no more.
    break_nodes(&data, &hosts());
    check(&mut tenant, &cluster.id).await;
    let states = node_states(&mut admin).await;
    let out = quarantined(&states);
    assert_eq!(out.len(), 2, "at most the cap: {states:?}");
    assert_eq!(
        states.len() - out.len(),
        POOL - 2,
        "the rest stay in service"
    );

    // The failure is reported, naming every node that was quarantined and the breaker.
    let c = admin.get_cluster(&cluster.id).await;
    assert_eq!(c.status, "degraded", "{c:?}");
    let reason = c.status_reason;
    for host in &out {
        assert!(reason.contains(host.as_str()), "{host} unnamed in {reason}");
    }
    assert!(
        reason.contains(&format!("quarantined: {}", out.join(", ")))
            && reason.contains("the automatic-quarantine breaker of H100-80GB is open")
            && reason.contains("gpufleet-agent breaker reset --gpu-type H100-80GB"),
        "{reason}"
    );
    let still_in = &c.nodes[0].hostname;
    assert!(!out.contains(still_in));

    // An event and a metric say so.
    let log = events(&mut admin, "breaker/H100-80GB").await;
    let opened: Vec<&Event> = log.iter().filter(|e| e.kind == "breaker_opened").collect();
    assert_eq!(opened.len(), 1, "{log:?}");
    assert_eq!(&opened[0].node, still_in);
    let cluster_log = events(&mut admin, &cluster.id).await;
    assert!(
        cluster_log
            .iter()
            .any(|e| e.kind == "quarantine_held" && &e.node == still_in),
        "{cluster_log:?}"
    );
    assert_eq!(breaker_open_metric(&scrape(&agent, &metrics)), Some("1"));
    let list = admin
        .fleet
        .list_quarantine_breakers(ListQuarantineBreakersRequest {})
        .await
        .unwrap()
        .into_inner()
        .breakers;
    let b = list.iter().find(|b| b.gpu_type == "H100-80GB").unwrap();
    assert!(
        b.open && b.cap == 2 && b.quarantines_in_window == 2,
        "{b:?}"
    );

    // The window passing does not close it: more failures an hour later stay in service.
    std::fs::write(&clock, (t0 + HOUR).to_string()).unwrap();
    check(&mut tenant, &cluster.id).await;
    assert_eq!(quarantined(&node_states(&mut admin).await), out);

    // The team cannot reset it, nor see it.
    let refused = status(
        tenant
            .fleet
            .reset_quarantine_breaker(ResetQuarantineBreakerRequest {
                gpu_type: "H100-80GB".into(),
            })
            .await,
    );
    assert_eq!(
        refused.code(),
        Code::PermissionDenied,
        "{}",
        refused.message()
    );
    let refused = status(
        tenant
            .fleet
            .list_quarantine_breakers(ListQuarantineBreakersRequest {})
            .await,
    );
    assert_eq!(
        refused.code(),
        Code::PermissionDenied,
        "{}",
        refused.message()
    );

    // The operator fixes what was wrong with all but the node in the cluster, and resets
    // the breaker with the admin CLI: the next check quarantines that node again, and its
    // replacement passes.
    break_nodes(&data, std::slice::from_ref(still_in));
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .args([
            "breaker",
            "reset",
            "--gpu-type",
            "H100-80GB",
            "--endpoint",
            &agent.endpoint,
            "--token",
            ADMIN,
        ])
        .output()
        .unwrap();
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    assert!(String::from_utf8_lossy(&cli.stdout).contains("breaker of H100-80GB is closed"));
    assert_eq!(breaker_open_metric(&scrape(&agent, &metrics)), Some("0"));
    assert!(events(&mut admin, "breaker/H100-80GB")
        .await
        .iter()
        .any(|e| e.kind == "breaker_reset"));
    let report = check(&mut tenant, &cluster.id).await;
    let now_out = quarantined(&node_states(&mut admin).await);
    assert_eq!(now_out.len(), 3, "{now_out:?}");
    assert!(now_out.contains(still_in));
    let c = admin.get_cluster(&cluster.id).await;
    assert_ne!(&c.nodes[0].hostname, still_in, "{report:?}");
    assert_eq!(c.node_count, 1);
}
