//! MIG layouts: checks through the planner, layouts applied on the simulated GPUs of a
//! cluster's nodes and recorded, in-place changes, and injected faults rolled back.

mod common;

use common::*;
use gpufleet_proto::v1::*;
use tonic::Code;

/// (profile, start) of every MIG device of every GPU of the cluster's nodes.
fn devices(k: &TenantCluster) -> Vec<Vec<(String, i32)>> {
    k.nodes
        .iter()
        .flat_map(|n| n.gpus.iter())
        .map(|g| {
            g.mig_devices
                .iter()
                .map(|d| (d.profile.clone(), d.start))
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn check_mig_layout_answers_fit_and_why_not() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut c = agent.admin().await;
    let fits = c
        .fleet
        .check_mig_layout(CheckMigLayoutRequest {
            gpu_type: "H100-80GB".into(),
            layout: mig_layout(&[("3g.40gb", 1), ("2g.20gb", 1), ("1g.10gb", 2)]),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(fits.fits, "{fits:?}");
    assert_eq!(fits.placements.len(), 4);
    assert_eq!(
        fits.placements[0].profile, "3g.40gb",
        "larger profiles are created first"
    );
    let no = c
        .fleet
        .check_mig_layout(CheckMigLayoutRequest {
            gpu_type: "H100-80GB".into(),
            layout: mig_layout(&[("3g.40gb", 3)]),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        !no.fits && !no.reason.is_empty() && !no.suggestions.is_empty(),
        "{no:?}"
    );
    let types = c.gpu_types().await;
    let h100 = types.iter().find(|t| t.name == "H100-80GB").unwrap();
    assert!(
        h100.mig_capable
            && h100
                .mig_profiles
                .iter()
                .any(|p| p.name == "1g.10gb" && p.max_per_gpu == 7)
    );
}

#[tokio::test]
async fn layouts_are_applied_recorded_changed_and_rolled_back() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agent = Agent::start(&data);
    let mut c = agent.admin().await;
    let (t, _) = c.tenant("team-a").await;
    c.quota(&t.id, "H100-80GB", 16, 0).await;

    let mut bad = Clients::cluster(&t.id, "bad", "H100-80GB", 1);
    bad.mig_layout = mig_layout(&[("3g.40gb", 3)]);
    assert_status(
        c.clusters.create_tenant_cluster(bad).await,
        Code::InvalidArgument,
        "mig_layout:",
    );

    let mut req = Clients::cluster(&t.id, "k", "H100-80GB", 1);
    req.mig_layout = mig_layout(&[("3g.40gb", 2)]);
    let k = c.create_cluster(req).await;
    let two_3g = vec![("3g.40gb".to_string(), 0), ("3g.40gb".to_string(), 4)];
    assert_eq!(devices(&k), vec![two_3g.clone(); 8]);
    assert!(k.nodes[0]
        .gpus
        .iter()
        .all(|g| g.mig_enabled && g.mig_devices.iter().all(|d| d.uuid.starts_with("MIG-"))));
    let host = k.nodes[0].hostname.clone();

    // The recorded state survives a restart.
    drop(c);
    assert!(agent.stop().success());
    let agent = Agent::start(&data);
    let mut c = agent.admin().await;
    let k = c.get_cluster(&k.id).await;
    assert_eq!(devices(&k), vec![two_3g.clone(); 8]);

    let change = UpdateTenantClusterRequest {
        id: k.id.clone(),
        mig_layout: mig_layout(&[("1g.10gb", 7)]),
        set_mig_layout: true,
        ..Default::default()
    };
    // A create failing mid-change (on the second GPU) rolls every GPU back.
    std::fs::write(data.join("sim-faults.toml"), "fail_create_after = 10\n").unwrap();
    assert_status(
        c.clusters.update_tenant_cluster(change.clone()).await,
        Code::Aborted,
        "rolled back",
    );
    let now = c.get_cluster(&k.id).await;
    assert_eq!(devices(&now), vec![two_3g.clone(); 8]);
    assert!(now.mig_layout == mig_layout(&[("3g.40gb", 2)]));

    // Work running on a GPU blocks the change, naming the instances.
    std::fs::write(
        data.join("sim-faults.toml"),
        format!("in_use = [\"{host}:3\"]\n"),
    )
    .unwrap();
    let msg = assert_status(
        c.clusters.update_tenant_cluster(change.clone()).await,
        Code::FailedPrecondition,
        "work is running",
    );
    assert!(msg.contains(&host) && msg.contains("GPU 3"), "{msg}");
    let now = c.get_cluster(&k.id).await;
    assert_eq!(devices(&now), vec![two_3g.clone(); 8]);

    std::fs::remove_file(data.join("sim-faults.toml")).unwrap();
    let changed = c.update_cluster(change).await;
    assert!(devices(&changed)
        .iter()
        .all(|g| g.len() == 7 && g.iter().all(|(p, _)| p == "1g.10gb")));

    // Deleting the cluster returns its node to whole GPUs.
    c.delete_cluster(&k.id).await;
    let nodes = c.nodes().await;
    let node = nodes.iter().find(|n| n.hostname == host).unwrap();
    assert!(node
        .gpus
        .iter()
        .all(|g| !g.mig_enabled && g.mig_devices.is_empty()));
}
