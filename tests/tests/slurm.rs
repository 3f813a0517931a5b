//! Slurm tenant clusters are real: through Terraform, with node-agent processes, a
//! cluster's `credentials` alone connect a client (its own munged with the cluster's key,
//! the cluster's slurm.conf plus `AuthInfo=socket=...`) that runs jobs across the
//! cluster's nodes on their MIG slices; another tenant's key is refused; scaling and a
//! layout change reach Slurm in place; destroy leaves no daemon behind.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpufleet_e2e::node_agent::wait_for;
use gpufleet_e2e::{eventually, Backend, NodeAgent, Terraform};
use serde_json::Value;

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(60);
const TRAIN: &str = "gpufleet_tenant_cluster.train";
const OTHER: &str = "gpufleet_tenant_cluster.other";

fn config(nodes: u32, layout: &str) -> String {
    config_with(nodes, layout, "")
}

/// `extra`: more attribute lines of the train cluster (e.g. its driver).
fn config_with(nodes: u32, layout: &str, extra: &str) -> String {
    format!(
        r#"
resource "gpufleet_tenant" "vision" {{
  name = "vision"
}}
resource "gpufleet_gpu_quota" "vision" {{
  tenant   = gpufleet_tenant.vision.name
  gpu_type = "H100-80GB"
  gpus     = 3
}}
resource "gpufleet_tenant_cluster" "train" {{
  tenant       = gpufleet_tenant.vision.name
  name         = "train"
  orchestrator = "slurm"
  gpu_type     = "H100-80GB"
  node_count   = {nodes}
  mig_layout   = {layout}
  {extra}
  depends_on   = [gpufleet_gpu_quota.vision]
}}
resource "gpufleet_tenant" "speech" {{
  name = "speech"
}}
resource "gpufleet_gpu_quota" "speech" {{
  tenant   = gpufleet_tenant.speech.name
  gpu_type = "H100-80GB"
  gpus     = 1
}}
resource "gpufleet_tenant_cluster" "other" {{
  tenant       = gpufleet_tenant.speech.name
  name         = "other"
  orchestrator = "slurm"
  gpu_type     = "H100-80GB"
  node_count   = 1
  depends_on   = [gpufleet_gpu_quota.speech]
}}
"#
    )
}

/// A tenant's Slurm client made from a cluster's credentials alone, as
/// docs/guides/slurm.md shows: the key in a file, a munged serving it on a socket of its
/// own, and slurm.conf with `AuthInfo=socket=` that socket.
struct Client {
    dir: tempfile::TempDir,
    munged: Child,
}

impl Client {
    fn connect(credentials: &Value) -> Client {
        let dir = tempfile::Builder::new()
            .prefix("slurm-client-")
            .tempdir()
            .unwrap();
        let key = decode_base64(credentials["munge_key"].as_str().expect("munge_key"));
        let mut f = fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .open(dir.path().join("munge.key"))
            .unwrap();
        f.write_all(&key).unwrap();
        drop(f);
        let p = |name: &str| dir.path().join(name).display().to_string();
        let munged = Command::new("munged")
            .args(["--foreground", "--force"])
            .args(["--key-file", &p("munge.key")])
            .args(["--socket", &p("munge.sock")])
            .args(["--pid-file", &p("munged.pid")])
            .args(["--log-file", &p("munged.log")])
            .args(["--seed-file", &p("munged.seed")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start munged (Debian's munge; scripts/bootstrap.sh installs it)");
        let socket = dir.path().join("munge.sock");
        wait_for("the client's munged socket", LIMIT, || {
            std::os::unix::net::UnixStream::connect(&socket)
                .ok()
                .map(|_| ())
        });
        let client = Client { dir, munged };
        client.use_conf(credentials);
        client
    }

    /// Writes the cluster's slurm_conf (as the credentials say now) plus our AuthInfo.
    fn use_conf(&self, credentials: &Value) {
        let conf = credentials["slurm_conf"].as_str().expect("slurm_conf");
        assert!(!conf.contains("AuthInfo"), "{conf}");
        let socket = self.dir.path().join("munge.sock");
        fs::write(
            self.conf(),
            format!("{conf}AuthInfo=socket={}\n", socket.display()),
        )
        .unwrap();
    }

    fn conf(&self) -> PathBuf {
        self.dir.path().join("slurm.conf")
    }

    /// Runs a Slurm command (killed after LIMIT); (success, stdout + stderr).
    fn run(&self, program: &str, args: &[&str]) -> (bool, String) {
        run_with_conf(&self.conf(), program, args)
    }

    fn ok(&self, program: &str, args: &[&str]) -> String {
        let (ok, out) = self.run(program, args);
        assert!(ok, "{program} {args:?} failed: {out}");
        out
    }

    /// For a wait: the command's output, or None while it fails (the controller may be
    /// restarting to take in a node that came back, and answers again once it has).
    fn poll(&self, program: &str, args: &[&str]) -> Option<String> {
        let (ok, out) = self.run(program, args);
        ok.then_some(out)
    }

    /// Submits a 2-second batch job to `node` that writes the time it ends into a file:
    /// (job id, that file).
    fn timed_job(&self, node: &str) -> (String, tempfile::NamedTempFile) {
        let end_file = tempfile::NamedTempFile::new().unwrap();
        let job = self.ok(
            "sbatch",
            &[
                "--parsable",
                "-N1",
                // Not slurm-<job>.out in the test's working directory.
                "--output=/dev/null",
                &format!("--nodelist={node}"),
                "--wrap",
                &format!("sleep 2; date +%s.%N > {}", end_file.path().display()),
            ],
        );
        (job.trim().to_string(), end_file)
    }

    /// Waits until every job of `ids` is running.
    async fn wait_running(&self, ids: &[String]) {
        eventually("the batch jobs running", LIMIT, || {
            let out = self.poll("squeue", &["-h", "-j", &ids.join(","), "-o", "%T"]);
            let running = out
                .is_some_and(|o| o.lines().filter(|l| l.trim() == "RUNNING").count() == ids.len());
            async move { running.then_some(()) }
        })
        .await;
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.munged.kill();
        let _ = self.munged.wait();
    }
}

/// When a [`Client::timed_job`] ended, from its file (seconds since the epoch).
fn ended_at(file: &Path) -> f64 {
    fs::read_to_string(file)
        .unwrap()
        .trim()
        .parse()
        .expect("the job ran to its end")
}

/// A file's modification time (seconds since the epoch): when an agent last wrote it.
fn modified_at(file: &Path) -> f64 {
    fs::metadata(file)
        .unwrap()
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn run_with_conf(conf: &Path, program: &str, args: &[&str]) -> (bool, String) {
    let mut child = Command::new(program)
        .args(args)
        .env("SLURM_CONF", conf)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    let deadline = Instant::now() + LIMIT;
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "{program} {args:?} hung");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn decode_base64(text: &str) -> Vec<u8> {
    let mut child = Command::new("base64")
        .arg("-d")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "munge_key is not base64");
    out.stdout
}

fn credentials(tf: &Terraform, address: &str) -> Value {
    let r = tf.resource(address);
    serde_json::from_str(r["credentials"].as_str().expect("credentials"))
        .expect("Slurm credentials are JSON")
}

fn cluster_name(credentials: &Value) -> String {
    let conf = credentials["slurm_conf"].as_str().unwrap();
    conf.lines()
        .find_map(|l| l.strip_prefix("ClusterName="))
        .expect("ClusterName")
        .to_string()
}

/// Node names that answered a job step, sorted.
fn answered(out: &str) -> Vec<String> {
    let mut names: Vec<String> = out.lines().map(|l| l.trim().to_string()).collect();
    names.sort();
    names
}

/// node -> GRES as `sinfo` shows them.
fn sinfo_gres(client: &Client) -> Vec<(String, String)> {
    let out = client.ok("sinfo", &["-h", "-N", "-o", "%N %G"]);
    let mut rows: Vec<(String, String)> = out
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(n, g)| (n.to_string(), g.trim().to_string()))
        .collect();
    rows.sort();
    rows
}

/// Processes whose command line names `needle` (from /proc).
fn processes_naming(needle: &str) -> Vec<String> {
    pids_naming(&[needle])
        .into_iter()
        .map(|(_, cmd)| cmd)
        .collect()
}

/// (pid, command line) of the processes whose command line contains every one of `needles`.
fn pids_naming(needles: &[&str]) -> Vec<(i32, String)> {
    let mut found = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        if !e
            .file_name()
            .to_string_lossy()
            .chars()
            .all(|c| c.is_ascii_digit())
        {
            continue;
        }
        let Ok(raw) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
        if needles.iter().all(|n| cmd.contains(n)) {
            let pid = e.file_name().to_string_lossy().parse().unwrap();
            found.push((pid, cmd));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slurm_cluster_runs_jobs_on_its_nodes_mig_slices_for_its_tenant_alone() {
    let mut backend = Backend::start_external("30s", "5m");
    let mut agents: Vec<NodeAgent> = ["n1", "n2", "n3", "n4"]
        .iter()
        .map(|n| NodeAgent::start(&backend, n, &["--gpus", "1"]))
        .collect();
    let admin = backend.admin().await;
    eventually("4 nodes ready", LIMIT, || {
        let mut admin = admin.clone();
        async move {
            let nodes = admin.nodes().await;
            (nodes.len() == 4 && nodes.iter().all(|n| n.state == "ready")).then_some(())
        }
    })
    .await;

    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(&config(2, r#"{ "3g.40gb" = 2 }"#));
    tf.init();
    tf.apply();
    let train = tf.resource(TRAIN);
    assert_eq!(train["status"], "running", "{train:#}");
    let endpoint = train["endpoint"].as_str().unwrap().to_string();
    let creds = credentials(&tf, TRAIN);
    assert!(
        creds["slurm_conf"].as_str().unwrap().contains(&format!(
            "SlurmctldPort={}",
            endpoint.rsplit(':').next().unwrap()
        )),
        "the endpoint is the controller's: {endpoint} {creds:#}"
    );
    let name = cluster_name(&creds);
    let other_creds = credentials(&tf, OTHER);
    let other_name = cluster_name(&other_creds);

    // With its credentials alone, the tenant runs a job on both nodes' MIG slices.
    let client = Client::connect(&creds);
    let out = client.ok("srun", &["-N2", "--gres=gpu:3g.40gb:1", "hostname"]);
    assert_eq!(out.lines().count(), 2, "{out}");
    let train_nodes = |tf: &Terraform| -> Vec<String> {
        let mut names: Vec<String> = tf.resource(TRAIN)["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["hostname"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        names
    };
    let nodes = train_nodes(&tf);
    let out = client.ok(
        "srun",
        &["-N2", "--gres=gpu:3g.40gb:1", "printenv", "SLURMD_NODENAME"],
    );
    assert_eq!(answered(&out), nodes, "{out}");
    // Each node's single H100 is split in two 3g.40gb slices.
    let gres: Vec<(String, String)> = nodes
        .iter()
        .map(|n| (n.clone(), "gpu:3g.40gb:2".to_string()))
        .collect();
    assert_eq!(sinfo_gres(&client), gres);

    // The other tenant's credentials work on its own cluster and are refused by this one.
    let other = Client::connect(&other_creds);
    assert_eq!(
        other.ok("sinfo", &["-h", "-N", "-o", "%G"]).trim(),
        "gpu:h100:1"
    );
    let foreign = Client::connect(&other_creds);
    foreign.use_conf(&creds);
    let (ok, out) = foreign.run("sinfo", &["-h", "-N"]);
    assert!(!ok, "another tenant's key reached this controller: {out}");
    let (ok, out) = foreign.run("srun", &["-N1", "hostname"]);
    assert!(!ok, "another tenant's key ran a job: {out}");
    drop(foreign);
    drop(other);

    // The controller is supervised: when it dies it is started again from its state.
    // (SIGTERM: it saves its state on the way out. After a SIGKILL Slurm's own recovery
    // of jobs it last saved running takes minutes, longer than this test should.)
    let ctld = |name: &str| pids_naming(&["slurmctld", &format!("/{name}/slurm.conf")]);
    let (killed, _) = ctld(&name).pop().expect("the cluster's slurmctld runs");
    assert!(Command::new("kill")
        .args(["-TERM", &killed.to_string()])
        .status()
        .unwrap()
        .success());
    eventually("slurmctld started again and answering", LIMIT, || {
        let again =
            ctld(&name).iter().any(|(pid, _)| *pid != killed) && client.run("sinfo", &["-h"]).0;
        async move { again.then_some(()) }
    })
    .await;

    // An agent that restarts (its slurmd dies with it) starts its slurmd again.
    let slurmd_of = |node: &str| pids_naming(&["slurmd", &format!("-N {node} "), &name]);
    let restarted = &nodes[0];
    let (before, _) = slurmd_of(restarted).pop().expect("slurmd runs on the node");
    agents
        .iter_mut()
        .find(|a| &a.name == restarted)
        .unwrap()
        .restart();
    eventually("slurmd started again by the restarted agent", LIMIT, || {
        let again = slurmd_of(restarted).iter().any(|(pid, _)| *pid != before);
        async move { again.then_some(()) }
    })
    .await;
    eventually("both nodes idle in Slurm again", LIMIT, || {
        let out = client.poll("sinfo", &["-h", "-N", "-o", "%N %T %E"]);
        let idle = out.is_some_and(|o| o.lines().filter(|l| l.contains(" idle ")).count() == 2);
        async move { idle.then_some(()) }
    })
    .await;
    eventually("a job on both nodes again", LIMIT, || {
        let (ok, out) = client.run(
            "srun",
            &["-N2", "--gres=gpu:3g.40gb:1", "printenv", "SLURMD_NODENAME"],
        );
        let done = ok && answered(&out) == nodes;
        async move { done.then_some(()) }
    })
    .await;

    // A control plane restart stops the controller with it and starts it again from its
    // state, on the same port: the tenant's client works as before.
    backend.restart();
    eventually(
        "the controller back after a control plane restart",
        LIMIT,
        || {
            let (ok, out) = client.run(
                "srun",
                &["-N2", "--gres=gpu:3g.40gb:1", "printenv", "SLURMD_NODENAME"],
            );
            let done = ok && answered(&out) == nodes;
            async move { done.then_some(()) }
        },
    )
    .await;

    // Scale to 3 in place: same cluster, same key, a job then spans 3 nodes.
    let id = train["id"].clone();
    tf.write_main(&config(3, r#"{ "3g.40gb" = 2 }"#));
    tf.apply();
    let scaled = tf.resource(TRAIN);
    assert_eq!(scaled["id"], id, "updated in place");
    assert_eq!(scaled["status"], "running", "{scaled:#}");
    let creds3 = credentials(&tf, TRAIN);
    assert_eq!(creds3["munge_key"], creds["munge_key"]);
    client.use_conf(&creds3);
    let out = client.ok(
        "srun",
        &["-N3", "--gres=gpu:3g.40gb:1", "printenv", "SLURMD_NODENAME"],
    );
    assert_eq!(answered(&out), train_nodes(&tf), "{out}");

    // A new layout: sinfo follows, and jobs get the new slices.
    tf.write_main(&config(3, r#"{ "1g.10gb" = 7 }"#));
    tf.apply();
    assert_eq!(tf.resource(TRAIN)["status"], "running");
    client.use_conf(&credentials(&tf, TRAIN));
    let gres: Vec<(String, String)> = train_nodes(&tf)
        .into_iter()
        .map(|n| (n, "gpu:1g.10gb:7".to_string()))
        .collect();
    assert_eq!(sinfo_gres(&client), gres);
    let out = client.ok("srun", &["-N3", "--gres=gpu:1g.10gb:7", "hostname"]);
    assert_eq!(out.lines().count(), 3, "{out}");

    // A driver change drains each node in Slurm first: a job running on a node finishes
    // before that node's driver is installed.
    let busy = train_nodes(&tf)[0].clone();
    let (job, end_file) = client.timed_job(&busy);
    client.wait_running(&[job]).await;
    tf.write_main(&config_with(
        3,
        r#"{ "1g.10gb" = 7 }"#,
        r#"driver_version = "570.133.20""#,
    ));
    tf.apply();
    assert_eq!(tf.resource(TRAIN)["status"], "running");
    let ended = ended_at(end_file.path());
    let agent = agents.iter().find(|a| a.name == busy).unwrap();
    let installed = modified_at(&agent.data_dir().join("driver-version"));
    assert!(
        installed >= ended,
        "{busy}'s driver was installed at {installed}, before its job ended at {ended}"
    );
    eventually("every node idle again in Slurm", LIMIT, || {
        let out = client.poll("sinfo", &["-h", "-N", "-o", "%N %T"]);
        let idle = out.is_some_and(|o| o.lines().all(|l| l.ends_with(" idle")));
        async move { idle.then_some(()) }
    })
    .await;

    // Scaling down drains the leaving node in Slurm first: its running job finishes
    // before its GPUs go back to whole GPUs. A job runs on every node, so whichever
    // node leaves has one.
    let before = train_nodes(&tf);
    let mut jobs = Vec::new();
    for node in &before {
        let (job, end_file) = client.timed_job(node);
        jobs.push((node.clone(), job, end_file));
    }
    let ids: Vec<String> = jobs.iter().map(|(_, id, _)| id.clone()).collect();
    client.wait_running(&ids).await;
    tf.write_main(&config_with(
        2,
        r#"{ "1g.10gb" = 7 }"#,
        r#"driver_version = "570.133.20""#,
    ));
    tf.apply();
    assert_eq!(tf.resource(TRAIN)["status"], "running");
    let after = train_nodes(&tf);
    let left: Vec<&String> = before.iter().filter(|n| !after.contains(n)).collect();
    assert_eq!((after.len(), left.len()), (2, 1), "{before:?} -> {after:?}");
    let (_, _, end_file) = jobs.iter().find(|(n, ..)| n == left[0]).unwrap();
    let ended = ended_at(end_file.path());
    let agent = agents.iter().find(|a| &a.name == left[0]).unwrap();
    let given_back = modified_at(&agent.data_dir().join("hardware.json"));
    assert!(
        given_back >= ended,
        "{}'s GPUs were re-partitioned at {given_back}, before its job ended at {ended}",
        left[0]
    );
    client.use_conf(&credentials(&tf, TRAIN));
    eventually("the two remaining nodes idle in Slurm", LIMIT, || {
        let out = client
            .poll("sinfo", &["-h", "-N", "-o", "%N %T"])
            .unwrap_or_default();
        let nodes: Vec<String> = out
            .lines()
            .filter(|l| l.ends_with(" idle"))
            .map(|l| l.split(' ').next().unwrap_or_default().to_string())
            .collect();
        let done = nodes == after;
        async move { done.then_some(()) }
    })
    .await;
    drop(client);

    // Destroy: no slurmctld, slurmd or munged of either cluster is left.
    assert!(
        !processes_naming(&name).is_empty(),
        "the daemons name their cluster"
    );
    tf.destroy();
    for cluster in [&name, &other_name] {
        eventually(&format!("no process of {cluster}"), LIMIT, || {
            let left = processes_naming(cluster);
            async move { left.is_empty().then_some(()) }
        })
        .await;
    }
    assert!(!backend.data_dir().join("slurm").join(&name).exists());
    for a in &agents {
        assert!(!a.data_dir().join("slurm").join(&name).exists());
    }
}
