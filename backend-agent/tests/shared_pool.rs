//! A tenant with only its own token cannot take the shared pool out of service: an
//! acceptance threshold no pair of nodes reaches fails that tenant's cluster, and every
//! node stays in service for everyone.

mod common;

use common::*;
use gpufleet_proto::v1::*;
use tonic::Code;

/// Every H100 node of the fleet, as the admin sees it.
async fn h100_nodes(admin: &mut Clients) -> Vec<Node> {
    admin.nodes_of("H100-80GB").await
}

#[tokio::test]
async fn an_unreachable_bandwidth_threshold_fails_the_cluster_and_quarantines_no_node() {
    let dir = tempfile::tempdir().unwrap();
    // A platform that claims more than its nodes deliver (loopback: tens of Gbit/s), so
    // the threshold passes admission and only the measurement can judge it.
    let agent = Agent::start_with(
        &dir.path().join("data"),
        &[
            "--admin-token",
            ADMIN,
            "--bus-bandwidth",
            "H100-80GB=100000",
        ],
    );
    let mut admin = agent.admin().await;
    let (team, token) = admin.tenant("team-a").await;
    admin.quota(&team.id, "H100-80GB", 16, 0).await;
    let (other, _) = admin.tenant("team-b").await;
    admin.quota(&other.id, "H100-80GB", 16, 0).await;

    // The tenant's own pipeline, with only its token: loopback gives tens of Gbit/s.
    let mut tenant = agent.clients(&token).await;
    let mut req = Clients::cluster(&team.id, "greedy", "H100-80GB", 2);
    req.set_acceptance = true;
    req.acceptance_level = "quick".into();
    req.min_bus_bandwidth_gbps = 100_000.0;
    req.run_acceptance_on_create = true;
    let refused = status(tenant.clusters.create_tenant_cluster(req).await);
    assert_ne!(refused.code(), Code::Ok);
    assert!(
        refused
            .message()
            .contains("acceptance.min_bus_bandwidth_gbps: no pair of the cluster's 2 nodes"),
        "{}",
        refused.message()
    );
    assert!(refused
        .message()
        .contains("no node was taken out of service"));

    let nodes = h100_nodes(&mut admin).await;
    assert!(!nodes.is_empty());
    let out: Vec<(&str, &str)> = nodes
        .iter()
        .filter(|n| n.state == "quarantined")
        .map(|n| (n.hostname.as_str(), n.state_reason.as_str()))
        .collect();
    assert!(out.is_empty(), "quarantined: {out:?}");

    // The pool is still everyone's: another team gets the same nodes.
    let cluster = admin
        .create_pool_cluster(&other.id, "after", "H100-80GB", 2)
        .await;
    assert_eq!(cluster.node_count, 2);
}

/// A tenant's threshold is bounded by what the fleet says its nodes of the model
/// deliver: above it, the create, the dry run the provider sends at plan and the update
/// are refused naming the attribute and the bound, and nothing is touched.
#[tokio::test]
async fn a_threshold_above_what_the_fleet_declares_is_refused_before_any_node_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("fleet.toml");
    std::fs::write(
        &fleet,
        "[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = 3\nbus_bandwidth_gbps = 400\n",
    )
    .unwrap();
    let agent = Agent::start_with(
        &dir.path().join("data"),
        &["--admin-token", ADMIN, "--fleet", fleet.to_str().unwrap()],
    );
    let mut admin = agent.admin().await;
    let (team, token) = admin.tenant("team-a").await;
    admin.quota(&team.id, "H100-80GB", 24, 0).await;
    let before = admin.snapshot().await;

    let mut tenant = agent.clients(&token).await;
    let ask = |gbps: f64, validate_only: bool| {
        let mut req = Clients::cluster(&team.id, "greedy", "H100-80GB", 2);
        req.set_acceptance = true;
        req.acceptance_level = "quick".into();
        req.min_bus_bandwidth_gbps = gbps;
        req.validate_only = validate_only;
        if validate_only {
            req.request_id.clear();
        }
        req
    };
    for validate_only in [true, false] {
        let refused = status(
            tenant
                .clusters
                .create_tenant_cluster(ask(100_000.0, validate_only))
                .await,
        );
        assert_eq!(
            refused.code(),
            Code::InvalidArgument,
            "{}",
            refused.message()
        );
        assert!(
            refused.message().starts_with(
                "acceptance.min_bus_bandwidth_gbps: must be at most 400 Gbit/s, the bus bandwidth this fleet declares its H100-80GB nodes deliver"
            ),
            "{}",
            refused.message()
        );
    }
    admin
        .assert_unchanged(&before, "a refused threshold touches nothing")
        .await;

    // At the bound it is admitted (the dry run says so too); an update above it is not.
    tenant
        .clusters
        .create_tenant_cluster(ask(400.0, true))
        .await
        .unwrap();
    let mut fits = ask(0.5, false);
    fits.run_acceptance_on_create = false;
    let cluster = tenant
        .clusters
        .create_tenant_cluster(fits)
        .await
        .unwrap()
        .into_inner();
    let refused = status(
        tenant
            .clusters
            .update_tenant_cluster(UpdateTenantClusterRequest {
                id: cluster.id.clone(),
                set_acceptance: true,
                acceptance_level: "quick".into(),
                min_bus_bandwidth_gbps: 401.0,
                validate_only: true,
                ..Default::default()
            })
            .await,
    );
    assert_eq!(
        refused.code(),
        Code::InvalidArgument,
        "{}",
        refused.message()
    );
    assert!(
        refused
            .message()
            .starts_with("acceptance.min_bus_bandwidth_gbps: must be at most 400 Gbit/s"),
        "{}",
        refused.message()
    );
    let quarantined = h100_nodes(&mut admin)
        .await
        .into_iter()
        .filter(|n| n.state == "quarantined")
        .count();
    assert_eq!(quarantined, 0);
}

#[tokio::test]
async fn a_quarantined_node_is_free_for_nobody() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agent = Agent::start(&data);
    let mut admin = agent.admin().await;
    let (team, _) = admin.tenant("team-a").await;
    admin.quota(&team.id, "H100-80GB", 8, 56).await;
    let cluster = admin
        .create_pool_cluster(&team.id, "train", "H100-80GB", 1)
        .await;
    let sick = cluster.nodes[0].hostname.clone();

    // Its GPU falls off the bus; the team's check takes it out and replaces it.
    std::fs::write(
        data.join("sim-faults.toml"),
        format!("[[xid]]\nnode = \"{sick}\"\ngpu = 0\ncode = 79\n"),
    )
    .unwrap();
    admin
        .health
        .run_health_check(RunHealthCheckRequest {
            cluster_id: cluster.id.clone(),
            level: "quick".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    std::fs::remove_file(data.join("sim-faults.toml")).unwrap();
    let nodes = h100_nodes(&mut admin).await;
    let state = |host: &str| {
        nodes
            .iter()
            .find(|n| n.hostname == host)
            .unwrap()
            .state
            .clone()
    };
    assert_eq!(state(&sick), "quarantined");
    let pool = nodes.iter().filter(|n| n.capacity == "pool").count() as i64;
    // In service and in no cluster: the pool less the replacement and the sick node.
    let free = pool - 2;

    let t = now();
    let available = admin
        .fleet
        .get_availability(AvailabilityRequest {
            gpu_type: "H100-80GB".into(),
            start_time: ts(t + HOUR),
            end_time: ts(t + 2 * HOUR),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(available.free_pool_nodes, free);
    let usage = admin
        .quotas
        .get_quota_usage(QuotaUsageRequest {
            tenant_id: team.id.clone(),
            gpu_type: "H100-80GB".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(usage.capacity_free, free * 8, "{usage:?}");

    // A reservation that needs the quarantined node is refused; one that fits is not.
    let refused = status(
        admin
            .reservations
            .create_reservation(Clients::reservation(
                &team.id,
                "H100-80GB",
                free + 1,
                t + HOUR,
                t + 2 * HOUR,
            ))
            .await,
    );
    assert_eq!(
        refused.code(),
        Code::FailedPrecondition,
        "{}",
        refused.message()
    );
    admin
        .create_reservation(&team.id, "H100-80GB", free, t + HOUR, t + 2 * HOUR)
        .await;

    // The operator's view agrees: `gpufleet-agent fleet` counts it as not free.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .args(["fleet", "--endpoint", &agent.endpoint, "--token", ADMIN])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let row: Vec<&str> = text
        .lines()
        .find(|l| l.starts_with("H100-80GB"))
        .unwrap()
        .split_whitespace()
        .collect();
    // GPU TYPE, GPUS/NODE, MEMORY MIB, POOL NODES, POOL FREE, ...
    assert_eq!(row[4], free.to_string(), "{text}");
}
