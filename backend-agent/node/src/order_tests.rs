//! RunHealthCheck orders through the real executor of two simulated agents: faults from
//! `sim-faults.toml` caught with value and threshold, journaled answers replayed with
//! their verdicts, and a bandwidth test between the agents' real listeners.

use std::path::Path;
use std::sync::Arc;

use gpufleet_gpu::hardware::SimulatedNode;
use gpufleet_proto::v1;

use crate as node;
use crate::link::Link;
use crate::session::Agent;
use crate::{bandwidth, driver, Parts};

const TOKEN: &str = "test-token-0123456789";

fn agent(dir: &Path, name: &str) -> Arc<Agent> {
    let model = gpufleet_gpu::catalog::model("H100-80GB").unwrap();
    let sim = Arc::new(SimulatedNode::new(name, model, 2, "550.54.15"));
    let faults_file = dir.join("sim-faults.toml");
    let listener = bandwidth::Listener::start(
        "127.0.0.1:0".parse().unwrap(),
        node::fault_throttle(Some(faults_file.clone()), name),
    )
    .unwrap();
    node::assemble(Parts {
        host: node::host::Declared::real(std::net::Ipv4Addr::LOCALHOST),
        shared_storage: None,
        login_limits: Default::default(),
        job_tmp_mib: gpufleet_slurm::job_tmp::DEFAULT_MIB,
        home_mib: gpufleet_slurm::home_fs::DEFAULT_MIB,
        slurm_cred_expire: gpufleet_slurm::conf::DEFAULT_CRED_EXPIRE_SECS,
        stop_workloads: true,
        cgroup_root: None,
        name: name.into(),
        capacity: "pool".into(),
        gpu_type: model.name.clone(),
        backend: sim.clone(),
        sim: Some(sim),
        faults_file: Some(faults_file),
        data_dir: dir.join(name),
        link: Link::plain(
            tonic::transport::Endpoint::from_static("http://127.0.0.1:9"),
            "t",
        ),
        installer: driver::Installer::Sim(driver::SimDriver::new(
            "550.54.15",
            None,
            std::time::Duration::ZERO,
        )),
        bandwidth: Some(listener),
        bandwidth_advertise: None,
    })
    .unwrap()
}

fn order(id: &str, level: &str, bandwidth: Option<v1::BandwidthTest>) -> v1::WorkOrder {
    v1::WorkOrder {
        id: id.into(),
        epoch: 0,
        kind: Some(v1::work_order::Kind::RunHealthCheck(v1::RunHealthCheck {
            level: level.into(),
            expected_driver: "550.54.15".into(),
            expected_layout: vec![v1::GpuLayout {
                index: 0,
                whole_gpu: true,
                placements: vec![],
            }],
            bandwidth,
            ..Default::default()
        })),
    }
}

fn failed(r: &v1::OrderResult) -> Vec<(String, String, String)> {
    r.health
        .as_ref()
        .unwrap()
        .checks
        .iter()
        .filter(|c| c.verdict == "fail")
        .map(|c| (c.name.clone(), c.value.clone(), c.threshold.clone()))
        .collect()
}

#[test]
fn faults_are_caught_with_value_and_threshold_and_the_answer_replays() {
    let dir = tempfile::tempdir().unwrap();
    let a = agent(dir.path(), "n1");
    let clean = a.exec.run(&order("o1", "medium", None));
    assert!(clean.ok, "{clean:?}");
    assert!(failed(&clean).is_empty(), "{:?}", failed(&clean));
    let report = clean.health.as_ref().unwrap();
    assert_eq!(report.level, "medium");
    assert!(report
        .checks
        .iter()
        .any(|c| c.name == "mig_layout" && c.verdict == "pass"));

    std::fs::write(
        dir.path().join("sim-faults.toml"),
        "[[ecc_burst]]\nnode = \"n1\"\ngpu = 1\nuncorrected = 3\n\
         [[xid]]\nnode = \"n1\"\ngpu = 0\ncode = 79\n\
         [[pcie_degraded]]\nnode = \"n1\"\ngpu = 1\ngen = 4\nwidth = 8\n\
         [[wrong_driver]]\nnode = \"n1\"\nversion = \"535.54.03\"\n\
         [[ecc_burst]]\nnode = \"other\"\ngpu = 0\nuncorrected = 9\n",
    )
    .unwrap();
    let faulty = a.exec.run(&order("o2", "medium", None));
    assert!(faulty.ok, "checks that ran answer ok, whatever they found");
    let uuid = |i: usize| faulty.inventory.as_ref().unwrap().gpus[i].uuid.clone();
    let fails = failed(&faulty);
    assert_eq!(
        fails,
        [
            ("driver".into(), "535.54.03".into(), "550.54.15".into()),
            (
                "xid".into(),
                "79".into(),
                "no XID that needs a GPU reset or service".into()
            ),
            (
                "ecc_uncorrected_volatile".into(),
                "3 uncorrected".into(),
                "0".into()
            ),
            ("pcie_link".into(), "Gen4 x8".into(), "Gen5 x16".into()),
        ]
    );
    let checks = &faulty.health.as_ref().unwrap().checks;
    let xid = checks
        .iter()
        .find(|c| c.name == "xid" && c.verdict == "fail")
        .unwrap();
    assert_eq!(xid.gpu_uuid, uuid(0));
    assert!(
        xid.detail.contains("GPU_HAS_FALLEN_OFF_THE_BUS"),
        "{}",
        xid.detail
    );

    // A re-sent order is replayed from the journal, verdicts included, not run again.
    std::fs::remove_file(dir.path().join("sim-faults.toml")).unwrap();
    let again = a.exec.run(&order("o2", "medium", None));
    assert!(again.replayed);
    assert_eq!(again.health, faulty.health);
    // Removing the faults clears them for the next check.
    assert!(failed(&a.exec.run(&order("o3", "quick", None))).is_empty());
}

#[test]
fn bad_orders_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let a = agent(dir.path(), "n1");
    let r = a.exec.run(&order("bad", "thorough", None));
    assert!(
        !r.ok && r.error.contains("quick, medium or long"),
        "{}",
        r.error
    );
    assert_eq!(r.error_kind, "rule");
    let test = v1::BandwidthTest {
        peers: vec![],
        duration_ms: 0,
        token: TOKEN.into(),
        min_gbps: 1.0,
    };
    let r = a.exec.run(&order("bad2", "quick", Some(test)));
    assert!(r.error.contains("bandwidth.duration_ms"), "{}", r.error);
}

/// Runs one bandwidth test between the two agents (a ring of two: each sends to the
/// other), both orders at once as the control plane sends them; returns each agent's
/// bandwidth results.
fn ring(a: &Arc<Agent>, b: &Arc<Agent>, id: &str, min_gbps: f64) -> Vec<v1::CheckResult> {
    let test = |to: &Arc<Agent>| v1::BandwidthTest {
        peers: vec![v1::BandwidthPeer {
            node: to.name.clone(),
            addr: to.bandwidth_addr.clone(),
        }],
        duration_ms: 400,
        token: format!("{TOKEN}-{id}"),
        min_gbps,
    };
    let (oa, ob) = (
        order(id, "quick", Some(test(b))),
        order(id, "quick", Some(test(a))),
    );
    let (ea, eb) = (a.exec.clone(), b.exec.clone());
    let ta = std::thread::spawn(move || ea.run(&oa));
    let tb = std::thread::spawn(move || eb.run(&ob));
    let (ra, rb) = (ta.join().unwrap(), tb.join().unwrap());
    [ra, rb]
        .iter()
        .flat_map(|r| {
            assert!(r.ok, "{r:?}");
            r.health.as_ref().unwrap().checks.clone()
        })
        .filter(|c| c.name == "bandwidth")
        .collect()
}

#[test]
fn a_bandwidth_test_between_two_agents_and_a_slow_network_pair() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (agent(dir.path(), "n1"), agent(dir.path(), "n2"));
    assert!(a.bandwidth_addr.starts_with("127.0.0.1:"));
    let open = ring(&a, &b, "bw1", 0.05);
    assert_eq!(open.len(), 2);
    assert_eq!((open[0].peer.as_str(), open[1].peer.as_str()), ("n2", "n1"));
    for c in &open {
        assert_eq!(c.verdict, "pass", "{c:?}");
        assert!(c.gbps > 0.05, "{c:?}");
        assert_eq!(c.threshold, ">= 0.05 Gbit/s");
    }
    // n2's network slows to 20 Mbit/s: both directions of the pair fall below 0.05.
    std::fs::write(
        dir.path().join("sim-faults.toml"),
        "[[slow_network]]\nnode = \"n2\"\nmbps = 20\n",
    )
    .unwrap();
    let slow = ring(&a, &b, "bw2", 0.05);
    for (c, before) in slow.iter().zip(&open) {
        assert_eq!(c.verdict, "fail", "{c:?}");
        assert!(c.gbps > 0.0 && c.gbps < 0.03, "{c:?}");
        assert!(
            before.gbps > 10.0 * c.gbps,
            "open {} vs slow {}",
            before.gbps,
            c.gbps
        );
        assert!(
            c.detail.contains("below the cluster's threshold"),
            "{}",
            c.detail
        );
    }
}

#[test]
fn an_order_of_an_older_epoch_is_refused_unrun_also_after_a_restart() {
    use gpufleet_wire::protocol_version::STALE_EPOCH;
    let dir = tempfile::tempdir().unwrap();
    let with_epoch = |id: &str, epoch: u64| v1::WorkOrder {
        epoch,
        ..order(id, "quick", None)
    };
    let a = agent(dir.path(), "n1");
    let newer = a.exec.run(&with_epoch("o1", 8));
    assert!(newer.ok, "{newer:?}");
    let stale = a.exec.run(&with_epoch("o2", 7));
    assert!(!stale.ok);
    assert_eq!(stale.error_kind, STALE_EPOCH);
    assert!(
        stale.error.contains("epoch 7") && stale.error.contains("older than epoch 8"),
        "{}",
        stale.error
    );
    assert!(stale.health.is_none(), "a refused order runs no check");
    assert!(
        a.exec.journal.lock().unwrap().get("o2").is_none(),
        "a refused order is not journaled"
    );
    // A Slurm question, answered apart from the queue, is fenced too.
    let query = v1::WorkOrder {
        id: "q1".into(),
        epoch: 7,
        kind: Some(v1::work_order::Kind::SlurmQuery(v1::SlurmQuery {
            cluster: "c1".into(),
            action: "status".into(),
            ..Default::default()
        })),
    };
    assert_eq!(a.exec.run_apart(&query).error_kind, STALE_EPOCH);
    drop(a);

    // The agent restarts on the same data dir: the epoch it saw is kept.
    let a = agent(dir.path(), "n1");
    assert_eq!(a.exec.fence.highest(), 8);
    assert_eq!(a.exec.run(&with_epoch("o3", 7)).error_kind, STALE_EPOCH);
    // The current leader's orders, and those of a control plane from before epochs, run.
    assert!(a.exec.run(&with_epoch("o4", 8)).ok);
    assert!(a.exec.run(&with_epoch("o5", 0)).ok);
}
