//! A randomized fault test, seeded and bounded: creates, updates (MIG layout, scale) and
//! deletes of clusters on real node-agent processes, each with a `kill -9` of the control
//! plane or of an agent at a random point of it; after each step, once the fleet has
//! settled, an independent check of what must hold whatever the faults:
//! - no healthy node is quarantined (no hardware fault is injected, so none may be);
//! - no node is ready without a live agent;
//! - no node is in two clusters, and every settled cluster holds exactly its node_count
//!   (a short one would plan empty);
//! - every agent's GPUs are what the control plane recorded for its node.
//!
//! A failure prints its seed: rerun it with `GPUFLEET_FAULT_SEED=<seed>` (and
//! `GPUFLEET_FAULT_STEPS=<n>` for a longer run).

use std::collections::HashMap;
use std::time::Duration;

use gpufleet_e2e::fixtures::{create_quota, create_tenant, request_id};
use gpufleet_e2e::{eventually, Backend, Clients, NodeAgent};
use gpufleet_proto::v1::{
    CreateTenantClusterRequest, DeleteTenantClusterRequest, Node, TenantCluster,
    UpdateTenantClusterRequest,
};

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(90);
const AGENTS: [&str; 4] = ["f1", "f2", "f3", "f4"];
const LAYOUTS: [&[(&str, i32)]; 4] = [&[], &[("3g.40gb", 2)], &[("1g.10gb", 7)], &[("2g.20gb", 3)]];

/// xorshift64*: small, and the same sequence for the same seed everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn layout(pairs: &[(&str, i32)]) -> HashMap<String, i32> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// The fault of one step.
#[derive(Debug, Clone, Copy)]
enum Fault {
    None,
    ControlPlane,
    Agent(usize),
}

/// What the fleet is once nothing is under way: every agent's node registered and ready
/// (none busy or unreachable) and every cluster running.
async fn settled(admin: &Clients) -> (Vec<Node>, Vec<TenantCluster>) {
    eventually("the fleet settled", LIMIT, || {
        let mut admin = admin.clone();
        async move {
            let nodes = admin.nodes().await;
            let clusters = admin.inventory().await.clusters;
            // Quarantine is checked by the caller: it never settles back.
            // Converged too: every node's GPUs as its place says (the reconciler's sweep
            // mends what crossing changes left, within its period).
            let done = nodes.len() == AGENTS.len()
                && nodes
                    .iter()
                    .all(|n| n.state == "ready" || n.state == "quarantined")
                && clusters.iter().all(|c| c.status == "running")
                && nodes.iter().all(|n| layout_wrong(n, &clusters).is_none());
            done.then_some((nodes, clusters))
        }
    })
    .await
}

/// Instances per MIG profile on one GPU (or asked of every GPU by a layout).
type Profiles = HashMap<String, i32>;

/// What the node's place wants of its GPUs (its cluster's layout, whole GPUs when free)
/// and what one of them has, when they differ.
fn layout_wrong(n: &Node, clusters: &[TenantCluster]) -> Option<(u32, Profiles, Profiles)> {
    let wanted: HashMap<String, i32> = clusters
        .iter()
        .find(|c| c.id == n.cluster_id)
        .map(|c| c.mig_layout.clone())
        .unwrap_or_default();
    n.gpus.iter().find_map(|g| {
        let mut have: HashMap<String, i32> = HashMap::new();
        for d in &g.mig_devices {
            *have.entry(d.profile.clone()).or_default() += 1;
        }
        (have != wanted).then(|| (g.index as u32, have, wanted.clone()))
    })
}

/// The invariants, checked against the API and each agent's own view of its GPUs.
fn check(at: &str, log: &str, nodes: &[Node], clusters: &[TenantCluster], agents: &[NodeAgent]) {
    let quarantined: Vec<String> = nodes
        .iter()
        .filter(|n| n.state == "quarantined")
        .map(|n| format!("{}: {}", n.hostname, n.state_reason))
        .collect();
    assert!(
        quarantined.is_empty(),
        "{at}: healthy nodes quarantined: {quarantined:?}\n--- control plane log (last 80 lines) ---\n{}",
        tail(log, 80)
    );
    for n in nodes.iter().filter(|n| n.state == "ready") {
        assert!(
            (0..30).contains(&n.heartbeat_age_seconds),
            "{at}: {} is ready without a live agent (heartbeat age {})",
            n.hostname,
            n.heartbeat_age_seconds
        );
    }
    for c in clusters {
        let held: Vec<&Node> = nodes.iter().filter(|n| n.cluster_id == c.id).collect();
        assert_eq!(
            held.len() as i64,
            c.node_count,
            "{at}: cluster {} holds {} of its {} nodes",
            c.name,
            held.len(),
            c.node_count
        );
    }
    // A node's cluster_id is one value, so no node is in two clusters; each cluster's own
    // answer must agree with the node list.
    for c in clusters {
        for n in &c.nodes {
            let listed = nodes.iter().find(|m| m.hostname == n.hostname).unwrap();
            assert_eq!(
                listed.cluster_id, c.id,
                "{at}: {} in two clusters' answers",
                n.hostname
            );
        }
    }
    // Every GPU is as its node's place says: its cluster's layout, whole when free.
    for n in nodes {
        assert!(
            layout_wrong(n, clusters).is_none(),
            "{at}: {} is not its place's layout: {:?}",
            n.hostname,
            layout_wrong(n, clusters)
        );
    }
    for a in agents {
        let node = nodes.iter().find(|n| n.hostname == a.name).unwrap();
        let recorded: Vec<Vec<String>> = node
            .gpus
            .iter()
            .map(|g| g.mig_devices.iter().map(|d| d.profile.clone()).collect())
            .collect();
        assert_eq!(
            a.profiles(),
            recorded,
            "{at}: {}'s GPUs differ from its record",
            a.name
        );
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_points_of_cluster_changes_keeps_the_fleet_truthful() {
    let seed = env_u64("GPUFLEET_FAULT_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1
    });
    let steps = env_u64("GPUFLEET_FAULT_STEPS").unwrap_or(12) as usize;
    eprintln!("fault test: GPUFLEET_FAULT_SEED={seed} GPUFLEET_FAULT_STEPS={steps}");
    let mut rng = Rng(seed);

    let mut backend = Backend::start_external("3s", "1h");
    let mut agents: Vec<NodeAgent> = AGENTS
        .iter()
        .map(|n| NodeAgent::start(&backend, n, &["--gpus", "2", "--sim-op-delay-ms", "20"]))
        .collect();
    let mut admin = backend.admin().await;
    settled(&admin).await;
    let (tenant, _) = create_tenant(&mut admin, "chaos").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 0, 8).await;

    let mut names = 0;
    for step in 0..steps {
        let clusters = admin.inventory().await.clusters;
        // The change of this step, started and left running.
        let mut api = admin.clone();
        let change = if clusters.is_empty() || (clusters.len() < 2 && rng.below(2) == 0) {
            names += 1;
            let req = CreateTenantClusterRequest {
                request_id: request_id(),
                tenant_id: tenant.id.clone(),
                name: format!("c{names}"),
                orchestrator: "kubernetes".into(),
                gpu_type: "H100-80GB".into(),
                node_count: 1 + rng.below(2) as i64,
                mig_layout: layout(LAYOUTS[rng.below(4) as usize]),
                ..Default::default()
            };
            let what = format!("create {} ({} nodes)", req.name, req.node_count);
            (
                what,
                tokio::spawn(
                    async move { api.clusters.create_tenant_cluster(req).await.map(|_| ()) },
                ),
            )
        } else {
            let c = &clusters[rng.below(clusters.len() as u64) as usize];
            match rng.below(3) {
                0 => {
                    let req = DeleteTenantClusterRequest { id: c.id.clone() };
                    let what = format!("delete {}", c.name);
                    (
                        what,
                        tokio::spawn(async move {
                            api.clusters.delete_tenant_cluster(req).await.map(|_| ())
                        }),
                    )
                }
                1 => {
                    let req = UpdateTenantClusterRequest {
                        id: c.id.clone(),
                        node_count: if c.node_count == 1 { 2 } else { 1 },
                        ..Default::default()
                    };
                    let what = format!("scale {} to {}", c.name, req.node_count);
                    (
                        what,
                        tokio::spawn(async move {
                            api.clusters.update_tenant_cluster(req).await.map(|_| ())
                        }),
                    )
                }
                _ => {
                    let req = UpdateTenantClusterRequest {
                        id: c.id.clone(),
                        mig_layout: layout(LAYOUTS[rng.below(4) as usize]),
                        set_mig_layout: true,
                        ..Default::default()
                    };
                    let what = format!("re-layout {}", c.name);
                    (
                        what,
                        tokio::spawn(async move {
                            api.clusters.update_tenant_cluster(req).await.map(|_| ())
                        }),
                    )
                }
            }
        };
        let (what, task) = change;
        // The random point: a fault injected this long into the change (a timing of the
        // fault, not a wait for an outcome).
        tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
        let fault = match rng.below(3) {
            0 => Fault::None,
            1 => Fault::ControlPlane,
            _ => Fault::Agent(rng.below(AGENTS.len() as u64) as usize),
        };
        eprintln!("step {step}: {what}, fault {fault:?}");
        match fault {
            Fault::None => {}
            Fault::ControlPlane => {
                backend.crash();
                backend.start_again();
                admin = backend.admin().await;
            }
            Fault::Agent(i) => agents[i].restart(),
        }
        // Its outcome may be a failure (the fault cut it short); what counts is the fleet.
        let outcome = tokio::time::timeout(LIMIT, task).await;
        assert!(
            outcome.is_ok(),
            "seed {seed}, step {step}: {what} never answered"
        );
        let (nodes, clusters) = settled(&admin).await;
        let at = format!("seed {seed}, step {step} ({what}, fault {fault:?})");
        check(&at, &backend.log(), &nodes, &clusters, &agents);
    }
    // Nothing of the team's node-local volumes outlives its agents: an agent killed
    // mid-mount once left one mounted, and the tests after this one found it.
    drop(agents);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let team = format!("/run/gpufleet/volumes/{}/", tenant.id);
    assert!(
        !mounts.contains(&team),
        "seed {seed}: left mounted: {mounts}"
    );
}
