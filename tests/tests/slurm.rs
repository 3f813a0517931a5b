//! Slurm tenant clusters are real: through Terraform, with node-agent processes, a team
//! logs in to its cluster's login with its own ssh key and the cluster's `credentials`
//! (user, host, port, known_hosts line), as the cluster's own unprivileged account, and
//! runs jobs across the cluster's nodes on their MIG slices; the account reaches no token,
//! key or other cluster; another team's key is refused; scaling and a layout change reach
//! Slurm in place; destroy leaves no daemon, account or runtime file behind. The
//! controller and login run on the cluster's head node (its first by name), by its
//! agent, and are reached at that node's address.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

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
  # As a team writes it: its public key file, trailing newline and all.
  ssh_public_keys = [file("${{path.module}}/vision.pub")]
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
  ssh_public_keys = [file("${{path.module}}/speech.pub")]
  depends_on   = [gpufleet_gpu_quota.speech]
}}
"#
    )
}

/// A team's ssh key pair, made as a user makes one (`ssh-keygen -t ed25519`).
struct TeamKey {
    dir: tempfile::TempDir,
    public: String,
}

impl TeamKey {
    fn new(comment: &str) -> TeamKey {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("id_ed25519");
        let made = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
            .arg(&key)
            .status()
            .expect("ssh-keygen (Debian's openssh-client)");
        assert!(made.success());
        let public = fs::read_to_string(key.with_extension("pub")).unwrap();
        TeamKey { dir, public }
    }

    fn private(&self) -> PathBuf {
        self.dir.path().join("id_ed25519")
    }
}

/// A team's Slurm session made from a cluster's credentials and the team's own key, as
/// docs/guides/slurm.md shows: ssh to the login as the cluster's user, the login's host
/// key checked against the credentials' known_hosts line; every command runs there.
struct Client {
    dir: tempfile::TempDir,
    key: PathBuf,
    user: String,
    host: String,
    port: u16,
}

impl Client {
    fn connect(credentials: &Value, key: &TeamKey) -> Client {
        Client::as_user(
            credentials,
            key,
            credentials["user"].as_str().expect("user"),
        )
    }

    /// A session that logs in as `user` (an attacker trying another account).
    fn as_user(credentials: &Value, key: &TeamKey, user: &str) -> Client {
        let dir = tempfile::tempdir().unwrap();
        let known = credentials["known_hosts"].as_str().expect("known_hosts");
        fs::write(dir.path().join("known_hosts"), format!("{known}\n")).unwrap();
        Client {
            dir,
            key: key.private(),
            user: user.to_string(),
            host: credentials["host"].as_str().expect("host").to_string(),
            port: credentials["port"].as_u64().expect("port") as u16,
        }
    }

    /// Runs a command on the login (killed after LIMIT); (success, stdout + stderr).
    fn run(&self, program: &str, args: &[&str]) -> (bool, String) {
        let command: Vec<String> = std::iter::once(program)
            .chain(args.iter().copied())
            .map(shell_quote)
            .collect();
        run_for(&mut self.ssh(&command.join(" ")), program, args)
    }

    /// An ssh session on the login that runs `script` until it ends or is killed: a team
    /// member's open session.
    fn hold(&self, script: &str) -> std::process::Child {
        self.ssh(script)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn ssh")
    }

    /// ssh to the login, running `command` there.
    fn ssh(&self, command: &str) -> Command {
        let mut ssh = Command::new("ssh");
        ssh.args(["-i", &self.key.display().to_string()])
            .args(["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"])
            .args(["-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR"])
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile={}",
                self.dir.path().join("known_hosts").display()
            ))
            .args(["-p", &self.port.to_string()])
            .arg(format!("{}@{}", self.user, self.host))
            .arg("--")
            .arg(command);
        ssh
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

    /// Submits an 8-second batch job to `node` (long enough to be seen running through
    /// an ssh login on a busy machine) that writes the time it ends into a file in
    /// the account's home: (job id, that file as the host sees it).
    fn timed_job(&self, credentials: &Value, node: &str) -> (String, PathBuf) {
        let name = format!("ended-{}", unique_name());
        let job = self.ok(
            "sbatch",
            &[
                "--parsable",
                "-N1",
                "--output=/dev/null",
                &format!("--nodelist={node}"),
                "--wrap",
                &format!("sleep 8; date +%s.%N > $HOME/{name}"),
            ],
        );
        let home = PathBuf::from(credentials["home"].as_str().expect("home"));
        (job.trim().to_string(), home.join(name))
    }

    /// Waits until `sinfo` shows the nodes as `want` ("NODE STATE GRES" lines).
    async fn wait_nodes(&self, what: &str, want: &str) {
        eventually(what, LIMIT, || {
            let out = self.poll("sinfo", &["-h", "-N", "-o", "%N %T %G"]);
            let shown = out.is_some_and(|o| o.trim() == want);
            async move { shown.then_some(()) }
        })
        .await;
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

/// One word for the login's shell, whatever it holds.
fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// A name no other job of this test run uses.
fn unique_name() -> String {
    static JOBS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = JOBS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    format!("{}-{n}", std::process::id())
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

/// Runs `command` (killed after LIMIT); (success, stdout + stderr).
fn run_for(command: &mut Command, program: &str, args: &[&str]) -> (bool, String) {
    gpufleet_e2e::commands::output_within(command, &format!("{program} {args:?}"), LIMIT)
}

/// `bytes` in base64 on one line, as `base64 -w0` writes them.
fn base64(bytes: &[u8]) -> String {
    let mut child = Command::new("base64")
        .arg("-w0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

fn credentials(tf: &Terraform, address: &str) -> Value {
    let r = tf.resource(address);
    serde_json::from_str(r["credentials"].as_str().expect("credentials"))
        .expect("Slurm credentials are JSON")
}

fn cluster_name(credentials: &Value) -> String {
    credentials["cluster"]
        .as_str()
        .expect("cluster")
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

    let (vision_key, speech_key) = (TeamKey::new("alice@vision"), TeamKey::new("bob@speech"));
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.keep_credentials_in_state(); // reads the deprecated attributes
    tf.write_file("vision.pub", &vision_key.public);
    tf.write_file("speech.pub", &speech_key.public);
    tf.write_main(&config(2, r#"{ "3g.40gb" = 2 }"#));
    tf.init();
    tf.apply();
    let train = tf.resource(TRAIN);
    assert_eq!(train["status"], "running", "{train:#}");
    let creds = credentials(&tf, TRAIN);
    assert_eq!(
        train["endpoint"].as_str().unwrap(),
        format!("{}:{}", creds["host"].as_str().unwrap(), creds["port"]),
        "the endpoint is the login's: {creds:#}"
    );
    let name = cluster_name(&creds);
    assert_eq!(creds["user"], name.as_str(), "{creds:#}");
    // The controller and login run on the head node, by its agent: the munge key is in
    // that agent's private dir, and nothing of the cluster is in the control plane's.
    let head = creds["login_node"].as_str().unwrap().to_string();
    let head_agent = agents
        .iter()
        .find(|a| a.name == head)
        .expect("the head's agent");
    let munge_key = fs::read(
        head_agent
            .data_dir()
            .join("slurm")
            .join(&name)
            .join("munge.key"),
    )
    .expect("the head's munge key stays in its agent's private dir");
    assert!(!backend.data_dir().join("slurm").exists());
    let given = train["credentials"].as_str().unwrap();
    assert!(
        !given.contains("munge") && !given.contains(&base64(&munge_key)),
        "{given}"
    );
    let other_creds = credentials(&tf, OTHER);
    let other_name = cluster_name(&other_creds);
    tf.assert_no_changes();

    // With its key, the team logs in as the cluster's account and runs a job on both
    // nodes' MIG slices.
    let client = Client::connect(&creds, &vision_key);
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

    attacker_probes(&backend, &agents, &creds, &client, &other_name);

    // The other team's key works on its own cluster and lets no one into this one.
    let other = Client::connect(&other_creds, &speech_key);
    assert_eq!(
        other.ok("sinfo", &["-h", "-N", "-o", "%G"]).trim(),
        "gpu:h100:1"
    );
    let foreign = Client::connect(&creds, &speech_key);
    let (ok, out) = foreign.run("id", &[]);
    assert!(!ok, "another team's key logged in to this cluster: {out}");
    // Nor can a team's key log in as root or as the other cluster's account.
    for user in ["root", other_name.as_str()] {
        let (ok, out) = Client::as_user(&creds, &vision_key, user).run("id", &[]);
        assert!(!ok, "logged in as {user}: {out}");
    }
    drop(other);

    // The controller is supervised: when it dies it is started again from its state.
    // (SIGTERM: it saves its state on the way out. After a SIGKILL Slurm's own recovery
    // of jobs it last saved running takes minutes, longer than this test should.)
    let ctld = |name: &str| pids_naming(&["slurmctld", &format!("/{name}/ctld/slurm.conf")]);
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

    // An agent killed and started again (a crash, an upgrade) leaves its slurmd (and, on
    // the head, the controller and the login) running: the new agent adopts them once the
    // control plane orders the cluster's current config, which they run already.
    let slurmd_of = |node: &str| pids_naming(&["slurmd", &format!("-N {node} "), &name]);
    let restarted = &nodes[0];
    assert_eq!(restarted, &head, "the head is the first node by name");
    let (before, _) = slurmd_of(restarted).pop().expect("slurmd runs on the node");
    let agent = agents.iter_mut().find(|a| &a.name == restarted).unwrap();
    agent.kill9();
    // What it kept from before goes stale (as after a change it missed while down): when
    // it registers again, the control plane gives it the cluster's current config.
    let kept_path = agent
        .data_dir()
        .join("slurm")
        .join(&name)
        .join("order.json");
    let mut kept: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&kept_path).unwrap()).unwrap();
    kept["slurm_conf"] = format!("{}# STALE-CONFIG\n", kept["slurm_conf"].as_str().unwrap()).into();
    fs::write(&kept_path, kept.to_string()).unwrap();
    agent.restart();
    eventually("the restarted agent runs the current config", LIMIT, || {
        let current = fs::read_to_string(&kept_path).is_ok_and(|k| !k.contains("STALE-CONFIG"));
        async move { current.then_some(()) }
    })
    .await;
    eventually("the restarted agent adopted its slurmd", LIMIT, || {
        let adopted = agent.log().lines().any(|l| {
            l.contains("adopted a daemon a former agent started") && l.contains("slurmd/")
        });
        async move { adopted.then_some(()) }
    })
    .await;
    let slurmds: Vec<i32> = slurmd_of(restarted).iter().map(|(pid, _)| *pid).collect();
    assert_eq!(
        slurmds,
        [before],
        "the slurmd that ran on, not a new one\n--- agent log ---\n{}",
        agent.log()
    );
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

    // A control plane restart stops nothing of the cluster (its daemons are its nodes'
    // agents'), and brings it to its nodes again without restarting them: the team's
    // session works as before.
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

    // Scale to 3 in place: same cluster, same login, a job then spans 3 nodes.
    let id = train["id"].clone();
    tf.write_main(&config(3, r#"{ "3g.40gb" = 2 }"#));
    tf.apply();
    let scaled = tf.resource(TRAIN);
    assert_eq!(scaled["id"], id, "updated in place");
    assert_eq!(scaled["status"], "running", "{scaled:#}");
    assert_eq!(credentials(&tf, TRAIN), creds, "the login stays as it was");
    let out = client.ok(
        "srun",
        &["-N3", "--gres=gpu:3g.40gb:1", "printenv", "SLURMD_NODENAME"],
    );
    assert_eq!(answered(&out), train_nodes(&tf), "{out}");

    // A new layout: sinfo follows, and jobs get the new slices.
    tf.write_main(&config(3, r#"{ "1g.10gb" = 7 }"#));
    tf.apply();
    assert_eq!(tf.resource(TRAIN)["status"], "running");
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
    let (job, end_file) = client.timed_job(&creds, &busy);
    client.wait_running(&[job]).await;
    tf.write_main(&config_with(
        3,
        r#"{ "1g.10gb" = 7 }"#,
        r#"driver_version = "570.133.20""#,
    ));
    tf.apply();
    assert_eq!(tf.resource(TRAIN)["status"], "running");
    let ended = ended_at(&end_file);
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
        let (job, end_file) = client.timed_job(&creds, node);
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
    let ended = ended_at(end_file);
    let agent = agents.iter().find(|a| &a.name == left[0]).unwrap();
    let given_back = modified_at(&agent.data_dir().join("hardware.json"));
    assert!(
        given_back >= ended,
        "{}'s GPUs were re-partitioned at {given_back}, before its job ended at {ended}",
        left[0]
    );
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

    // A job still running when the cluster is destroyed: its slurmstepd and its processes
    // must go with the cluster.
    let long = client.ok(
        "sbatch",
        &[
            "--parsable",
            "-N1",
            "--output=/dev/null",
            "--wrap",
            "sleep 600",
        ],
    );
    client.wait_running(&[long.trim().to_string()]).await;
    // This cluster's only: other tests' jobs run beside it, and need not end with it.
    let stepds: Vec<i32> = pids_naming(&["slurmstepd"])
        .into_iter()
        .map(|(pid, _)| pid)
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| String::from_utf8_lossy(&env).contains(&format!("/{name}/")))
        })
        .collect();
    assert!(
        !stepds.is_empty(),
        "the running job has a slurmstepd of its cluster"
    );

    // A team that drops its key from the configuration can no longer log in.
    tf.write_main(
        &config_with(
            2,
            r#"{ "1g.10gb" = 7 }"#,
            r#"driver_version = "570.133.20""#,
        )
        .replace(
            r#"ssh_public_keys = [file("${path.module}/vision.pub")]"#,
            "ssh_public_keys = []",
        ),
    );
    tf.apply();
    tf.assert_no_changes();
    let (ok, out) = client.run("id", &[]);
    assert!(!ok, "logged in with a key taken out: {out}");
    drop(client);

    // Destroy: no slurmctld, slurmd, munged or sshd of either cluster is left, nor its
    // account or runtime files.
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
        assert!(
            !Path::new("/run/gpufleet").join(cluster.as_str()).exists(),
            "{cluster}'s runtime directory is left"
        );
        let account = Command::new("getent")
            .args(["passwd", cluster.as_str()])
            .output()
            .unwrap();
        assert!(!account.status.success(), "{cluster}'s account is left");
    }
    eventually(
        "no slurmstepd of the destroyed clusters' jobs",
        LIMIT,
        || {
            let left: Vec<i32> = stepds
                .iter()
                .copied()
                .filter(|pid| Path::new(&format!("/proc/{pid}")).exists())
                .collect();
            async move { left.is_empty().then_some(()) }
        },
    )
    .await;
    assert!(!backend.data_dir().join("slurm").join(&name).exists());
    for a in &agents {
        assert!(!a.data_dir().join("slurm").join(&name).exists());
    }
}

/// What the team's own account can reach, tried as an attacker with the team's key: it
/// runs as itself (never root) on the login and in jobs, and reads no token, no key and
/// nothing of the other cluster, whose munged and configuration it cannot open.
fn attacker_probes(
    backend: &Backend,
    agents: &[NodeAgent],
    creds: &Value,
    client: &Client,
    other_cluster: &str,
) {
    let uid = client.ok("id", &["-u"]).trim().to_string();
    assert_ne!(uid, "0", "the login session is root");
    let on_nodes = client.ok("srun", &["-N2", "id", "-u"]);
    assert_eq!(
        on_nodes.lines().map(str::trim).collect::<Vec<_>>(),
        vec![uid.as_str(); 2],
        "jobs run as the cluster's account: {on_nodes}"
    );
    // The platform's secrets: the control plane's and the agents' data dirs (tokens, keys,
    // the database), and every process's command line and environment.
    let mut secrets = vec![
        backend.data_dir().join("state.db"),
        backend.data_dir().join("slurm"),
    ];
    secrets.extend(agents.iter().map(|a| a.data_dir()));
    for path in &secrets {
        let shown = path.display().to_string();
        let (ok, out) = client.run("ls", &[&shown]);
        // Refused, or not there at all: the login has a /tmp of its own, so data dirs in
        // this machine's /tmp (as these tests make them) are out of its sight.
        assert!(
            !ok && (out.contains("Permission denied") || out.contains("No such file")),
            "the team's account lists {shown}: {out}"
        );
        let (ok, out) = client.run("srun", &["-N1", "cat", &shown]);
        assert!(!ok, "a job reads {shown}: {out}");
    }
    let script = "cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'";
    for (where_, out) in [
        ("login", client.run("sh", &["-c", script]).1),
        ("job", client.run("srun", &["-N1", "sh", "-c", script]).1),
    ] {
        // What it reads is its own processes' (`/proc` is hidepid=invisible there): no
        // daemon's command line, and no token.
        assert!(
            out.contains("/proc/"),
            "nothing read on the {where_}: {out}"
        );
        for daemon in ["slurmd", "sshd", "munged", "gpufleet-agent"] {
            assert!(
                !out.contains(daemon),
                "the {where_} reads {daemon}'s command line: {out}"
            );
        }
        for token in [backend.admin_token(), backend.join_token()] {
            assert!(!out.contains(token), "a token is readable on the {where_}");
        }
    }
    // The other cluster: its runtime directory, munged socket and client configuration.
    let theirs = format!("/run/gpufleet/{other_cluster}");
    for path in [
        theirs.clone(),
        format!("{theirs}/login/slurm.conf"),
        format!("{theirs}/login/munge.sock"),
    ] {
        let (ok, out) = client.run("ls", &["-l", &path]);
        assert!(!ok && out.contains("Permission denied"), "{path}: {out}");
    }
    let (ok, out) = client.run(
        "munge",
        &["-n", "-S", &format!("{theirs}/login/munge.sock")],
    );
    assert!(!ok, "the other cluster's munged gave a credential: {out}");
    let (ok, out) = client.run(
        "sh",
        &["-c", &format!("SLURM_CONF={theirs}/login/slurm.conf sinfo")],
    );
    assert!(!ok, "the other cluster answered: {out}");
    // Its own munged (the head node's, which its login's configuration names) serves it
    // only as itself: a credential names its own uid.
    let mine = client
        .ok(
            "sh",
            &["-c", "sed -n 's/^AuthInfo=socket=//p' \"$SLURM_CONF\""],
        )
        .trim()
        .to_string();
    assert!(
        mine.starts_with(&format!("/run/gpufleet/{}/n", cluster_name(creds))),
        "{mine}"
    );
    let decoded = client.ok(
        "sh",
        &["-c", &format!("munge -n -S {mine} | unmunge -S {mine}")],
    );
    assert!(
        decoded
            .lines()
            .any(|l| l.starts_with("UID:") && l.contains(&format!("({uid})"))),
        "{decoded}"
    );
    assert!(creds["home"]
        .as_str()
        .is_some_and(|h| h.starts_with("/run/gpufleet/")));
}

/// One team's Slurm cluster of `nodes` nodes split `layout` (HCL), with its key.
fn single(nodes: u32, layout: &str) -> String {
    format!(
        r#"
resource "gpufleet_tenant" "vision" {{
  name = "vision"
}}
resource "gpufleet_gpu_quota" "vision" {{
  tenant   = gpufleet_tenant.vision.name
  gpu_type = "H100-80GB"
  gpus     = {nodes}
}}
resource "gpufleet_tenant_cluster" "train" {{
  tenant          = gpufleet_tenant.vision.name
  name            = "train"
  orchestrator    = "slurm"
  gpu_type        = "H100-80GB"
  node_count      = {nodes}
  mig_layout      = {layout}
  ssh_public_keys = [file("${{path.module}}/vision.pub")]
  depends_on      = [gpufleet_gpu_quota.vision]
}}
"#
    )
}

/// Waits until the control plane has `n` ready nodes.
async fn nodes_ready(backend: &Backend, n: usize) {
    let admin = backend.admin().await;
    eventually(&format!("{n} nodes ready"), LIMIT, || {
        let mut admin = admin.clone();
        async move {
            let nodes = admin.nodes().await;
            (nodes.len() == n && nodes.iter().all(|x| x.state == "ready")).then_some(())
        }
    })
    .await;
}

/// A team's working directory, initialized, for a one-node cluster split `layout` (HCL)
/// on `backend`, with the team's key.
fn one_node_team(backend: &Backend, layout: &str) -> (TeamKey, Terraform) {
    let key = TeamKey::new("alice@vision");
    let tf = Terraform::new(backend, backend.admin_token());
    tf.keep_credentials_in_state(); // reads the deprecated attributes
    tf.write_file("vision.pub", &key.public);
    tf.write_main(&single(1, layout));
    tf.init();
    (key, tf)
}

/// With embedded node agents (the nodes are the control plane's host), `serve
/// --advertise-address` is the address the nodes declare, so it is where the cluster's
/// head node runs its login and controller: the endpoint and credentials name it, the
/// nodes' slurmd reach the controller there, and a control plane restarted with another
/// address moves the cluster's endpoint with it, with the same host key. Every daemon and
/// the login listen in the operator's `--slurm-ports` range, and keep their ports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_slurm_cluster_is_reached_at_the_advertised_address() {
    let fleet = "[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = 1\ngpus_per_node = 1\n";
    let serve = |addr: &'static str| ["--advertise-address", addr, "--slurm-ports", "31000-31099"];
    let in_range = |port: u64| (31000..=31099).contains(&port);
    let mut backend = Backend::start_with_fleet_and_args(fleet, &serve("127.0.0.2"));
    let (key, tf) = one_node_team(&backend, "{}");
    tf.apply();
    let creds = credentials(&tf, TRAIN);
    assert_eq!(creds["host"], "127.0.0.2", "{creds:#}");
    let port = creds["port"].as_u64().unwrap();
    assert_eq!(tf.resource(TRAIN)["endpoint"], format!("127.0.0.2:{port}"));
    assert!(
        creds["known_hosts"]
            .as_str()
            .unwrap()
            .starts_with(&format!("[127.0.0.2]:{port} ")),
        "{creds:#}"
    );
    let client = Client::connect(&creds, &key);
    assert_eq!(client.ok("srun", &["-N1", "hostname"]).lines().count(), 1);
    let out = client.ok("scontrol", &["show", "config"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with("SlurmctldHost[0]") && l.contains("(127.0.0.2)")),
        "{out}"
    );
    assert!(in_range(port), "login port {port}");
    let config_port = |key: &str| -> u64 {
        let line = out.lines().find(|l| l.starts_with(key)).unwrap();
        line.split('=').nth(1).unwrap().trim().parse().unwrap()
    };
    let controller_port = config_port("SlurmctldPort");
    assert!(in_range(controller_port), "SlurmctldPort {controller_port}");
    let node = client.ok("scontrol", &["show", "node"]);
    let slurmd_port: u64 = node
        .split_whitespace()
        .find_map(|w| w.strip_prefix("Port="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(in_range(slurmd_port), "slurmd port {slurmd_port}: {node}");
    drop(client);

    // Restarted with another address: the endpoint and credentials follow it, the login
    // listens there (and no longer on the old one) with the same host key, and jobs run
    // again.
    backend.restart_with_args(&serve("127.0.0.3"));
    let moved = eventually("the endpoint on the new address", LIMIT, || {
        tf.refresh();
        let creds = credentials(&tf, TRAIN);
        let moved = (creds["host"] == "127.0.0.3").then_some(creds);
        async move { moved }
    })
    .await;
    assert_eq!(tf.resource(TRAIN)["endpoint"], format!("127.0.0.3:{port}"));
    let key_of = |c: &Value| {
        c["known_hosts"]
            .as_str()
            .unwrap()
            .split_once(' ')
            .unwrap()
            .1
            .to_string()
    };
    assert_eq!(
        key_of(&moved),
        key_of(&creds),
        "the login's host key is the cluster's"
    );
    let client = Client::connect(&moved, &key);
    eventually("a job through the moved login", LIMIT, || {
        let (ok, out) = client.run("srun", &["-N1", "hostname"]);
        async move { (ok && out.lines().count() == 1).then_some(()) }
    })
    .await;
    let (ok, out) = Client::connect(&creds, &key).run("id", &[]);
    assert!(!ok, "the login still answers on the old address: {out}");
    drop(client);
    tf.destroy();
}

/// The machine's host name, as Slurm's NodeHostname shows it.
fn this_hostname() -> String {
    let out = Command::new("hostname").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Submits a batch job on one `gres` slice that leaves a marker in the account's home and
/// ends only once `all` markers of `tag` are there, then says it is done: jobs that run
/// one at a time never finish. Returns its id.
fn barrier_job(client: &Client, gres: &str, tag: &str, all: usize) -> String {
    let script = format!(
        "touch $HOME/{tag}-m-$SLURM_JOB_ID; \
         until [ $(ls $HOME | grep -c '^{tag}-m-') -ge {all} ]; do sleep 0.1; done; \
         touch $HOME/{tag}-d-$SLURM_JOB_ID"
    );
    client
        .ok(
            "sbatch",
            &[
                "--parsable",
                "-N1",
                &format!("--gres={gres}"),
                "--output=/dev/null",
                "--wrap",
                &script,
            ],
        )
        .trim()
        .to_string()
}

/// Files in `home` whose names start with `prefix`.
fn count_files(home: &Path, prefix: &str) -> usize {
    fs::read_dir(home)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .count()
        })
        .unwrap_or(0)
}

/// A node declares its host's address, name, CPUs and memory at registration, and Slurm
/// schedules by GRES, CPUs and memory: four one-slice jobs share a node with four free
/// MIG slices, all running at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_share_a_node_that_declares_its_address_cpus_and_memory() {
    let backend = Backend::start_external("30s", "5m");
    let mut agent = NodeAgent::start(
        &backend,
        "decl1",
        &[
            "--gpus",
            "1",
            "--address",
            "127.0.0.3",
            "--cpus",
            "8",
            "--memory-mib",
            "16384",
        ],
    );
    nodes_ready(&backend, 1).await;
    let (key, tf) = one_node_team(&backend, r#"{ "1g.10gb" = 4 }"#);
    tf.apply();
    assert_eq!(tf.resource(TRAIN)["status"], "running");
    let creds = credentials(&tf, TRAIN);
    let client = Client::connect(&creds, &key);
    assert_eq!(
        client
            .ok("sinfo", &["-h", "-N", "-o", "%N %c %m %G"])
            .trim(),
        "decl1 8 16384 gpu:1g.10gb:4"
    );
    let node = client.ok("scontrol", &["show", "node", "decl1"]);
    for want in [
        "NodeAddr=127.0.0.3".to_string(),
        format!("NodeHostName={}", this_hostname()),
        "CPUTot=8".into(),
        "RealMemory=16384".into(),
        "Gres=gpu:1g.10gb:4".into(),
    ] {
        assert!(node.contains(&want), "no {want} in {node}");
    }

    let tag = format!("share-{}", unique_name());
    let ids: Vec<String> = (0..4)
        .map(|_| barrier_job(&client, "gpu:1g.10gb:1", &tag, 4))
        .collect();
    let home = PathBuf::from(creds["home"].as_str().unwrap());
    eventually("four jobs that wait for each other all done", LIMIT, || {
        let done = count_files(&home, &format!("{tag}-d-"));
        async move { (done == 4).then_some(()) }
    })
    .await;
    eventually("the jobs gone from the queue", LIMIT, || {
        let out = client.poll("squeue", &["-h", "-j", &ids.join(",")]);
        async move { out.is_some_and(|o| o.trim().is_empty()).then_some(()) }
    })
    .await;

    // The agent comes back declaring another host: Slurm follows, and so does the login
    // (the node is the cluster's head).
    drop(client);
    agent.restart_with(&[
        "--gpus",
        "1",
        "--address",
        "127.0.0.4",
        "--cpus",
        "4",
        "--memory-mib",
        "8192",
    ]);
    let moved = eventually("the login on the node's new address", LIMIT, || {
        tf.refresh();
        let creds = credentials(&tf, TRAIN);
        let moved = (creds["host"] == "127.0.0.4").then_some(creds);
        async move { moved }
    })
    .await;
    let client = Client::connect(&moved, &key);
    eventually("the node as it declares itself now", LIMIT, || {
        let out = client.poll("scontrol", &["show", "node", "decl1"]);
        let now = out.is_some_and(|o| {
            [
                "NodeAddr=127.0.0.4",
                "CPUTot=4",
                "RealMemory=8192",
                "State=IDLE",
            ]
            .iter()
            .all(|w| o.contains(w))
        });
        async move { now.then_some(()) }
    })
    .await;
    let out = client.ok("srun", &["-N1", "--gres=gpu:1g.10gb:1", "hostname"]);
    assert_eq!(out.lines().count(), 1, "{out}");
    drop(client);
    tf.destroy();
}

/// A control plane whose data dir is about 100 characters long (a clone in a long path),
/// with one embedded node of one H100: batch jobs run (every Unix socket of the cluster's
/// daemons and job steps lives under a short path, whatever the data dir).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_jobs_run_under_a_long_data_dir() {
    // The fleet file says what its node declares to Slurm.
    let fleet = "[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = 1\ngpus_per_node = 1\n\
                 cpus_per_node = 12\nmemory_mib_per_node = 24576\n";
    let backend = Backend::start_with_fleet_in_long_dir(fleet, &[], 100);
    assert!(backend.data_dir().display().to_string().len() >= 100);
    let (key, tf) = one_node_team(&backend, r#"{ "3g.40gb" = 2 }"#);
    tf.apply();
    assert_eq!(tf.resource(TRAIN)["status"], "running");
    let creds = credentials(&tf, TRAIN);
    let client = Client::connect(&creds, &key);
    assert_eq!(
        client.ok("sinfo", &["-h", "-N", "-o", "%c %m"]).trim(),
        "12 24576"
    );
    let tag = format!("long-{}", unique_name());
    for _ in 0..2 {
        barrier_job(&client, "gpu:3g.40gb:1", &tag, 2);
    }
    let home = PathBuf::from(creds["home"].as_str().unwrap());
    eventually("the batch jobs done", LIMIT, || {
        let done = count_files(&home, &format!("{tag}-d-"));
        let queue = client.poll("squeue", &["-h", "-o", "%i %T %r"]);
        async move {
            assert!(
                !queue.as_deref().unwrap_or_default().contains("held"),
                "a batch job is held: {queue:?}"
            );
            (done == 2).then_some(())
        }
    })
    .await;
    let out = client.ok("srun", &["-N1", "--gres=gpu:3g.40gb:1", "hostname"]);
    assert_eq!(out.lines().count(), 1, "{out}");
    drop(client);
    tf.destroy();
}

/// A MIG layout change on a Slurm cluster drains the node first: a running job finishes
/// (COMPLETED, not NODE_FAIL) before the layout changes, the apply succeeds, and the node
/// is back in service with the new slices.
/// A one-node Slurm cluster (node `node`, one GPU split `3g.40gb` x 2) with a batch job
/// on one slice that runs until the test creates `$HOME/<tag>-go`, then touches
/// `$HOME/<tag>-done`. Fields drop in order: the session first, the backend last.
struct HeldJob {
    client: Client,
    tf: Terraform,
    _key: TeamKey,
    agent: NodeAgent,
    _backend: Backend,
    home: PathBuf,
    tag: String,
    job: String,
}

impl HeldJob {
    async fn start(node: &str, tag: &str) -> HeldJob {
        let backend = Backend::start_external("30s", "5m");
        let agent = NodeAgent::start(&backend, node, &["--gpus", "1"]);
        nodes_ready(&backend, 1).await;
        let (key, tf) = one_node_team(&backend, r#"{ "3g.40gb" = 2 }"#);
        tf.apply();
        let creds = credentials(&tf, TRAIN);
        let client = Client::connect(&creds, &key);
        let home = PathBuf::from(creds["home"].as_str().unwrap());
        let tag = format!("{tag}-{}", unique_name());
        let job = client
            .ok(
                "sbatch",
                &[
                    "--parsable",
                    "-N1",
                    "--gres=gpu:3g.40gb:1",
                    "--output=/dev/null",
                    "--wrap",
                    &format!(
                        "until [ -e $HOME/{tag}-go ]; do sleep 0.1; done; touch $HOME/{tag}-done"
                    ),
                ],
            )
            .trim()
            .to_string();
        client.wait_running(std::slice::from_ref(&job)).await;
        HeldJob {
            client,
            tf,
            _key: key,
            agent,
            _backend: backend,
            home,
            tag,
            job,
        }
    }

    /// Logs out and destroys the cluster.
    fn end(self) {
        let HeldJob { client, tf, .. } = self;
        drop(client);
        tf.destroy();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_change_lets_running_slurm_jobs_finish_first() {
    let held = HeldJob::start("lay1", "layout").await;
    let (tf, client, home, tag, job) = (&held.tf, &held.client, &held.home, &held.tag, &held.job);
    let agent = &held.agent;

    tf.write_main(&single(1, r#"{ "1g.10gb" = 7 }"#));
    std::thread::scope(|s| {
        let apply = s.spawn(|| tf.apply());
        wait_for("the node draining for the new layout", LIMIT, || {
            let out = client.poll("sinfo", &["-h", "-N", "-o", "%N %T %G"])?;
            out.lines()
                .any(|l| l.trim() == "lay1 draining gpu:3g.40gb:2")
                .then_some(())
        });
        let (_, queue) = client.run("squeue", &["-h", "-j", job, "-o", "%T"]);
        assert_eq!(
            queue.trim(),
            "RUNNING",
            "the job runs on while its node drains"
        );
        fs::write(home.join(format!("{tag}-go")), "").unwrap();
        apply.join().expect("the apply succeeds");
    });
    assert_eq!(tf.resource(TRAIN)["status"], "running");
    let ended = modified_at(&home.join(format!("{tag}-done")));
    let partitioned = modified_at(&agent.data_dir().join("hardware.json"));
    assert!(
        partitioned >= ended,
        "the GPU was re-partitioned at {partitioned}, before its job ended at {ended}"
    );
    let shown = client.ok("scontrol", &["show", "job", job]);
    assert!(shown.contains("JobState=COMPLETED"), "{shown}");
    client
        .wait_nodes(
            "the node back in service with its new slices",
            "lay1 idle gpu:1g.10gb:7",
        )
        .await;
    held.end();
}

/// Processes whose real uid is `uid`, as "pid command line".
fn processes_of(uid: u32) -> Vec<String> {
    let mut found = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(status) = fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let real = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().next())
            .and_then(|u| u.parse::<u32>().ok());
        // A zombie is gone already; it only waits for its parent to reap it.
        let zombie = status
            .lines()
            .any(|l| l.starts_with("State:") && l.contains('Z'));
        if real == Some(uid) && !zombie {
            let cmd = fs::read(e.path().join("cmdline")).unwrap_or_default();
            found.push(format!(
                "{} {}",
                e.file_name().to_string_lossy(),
                String::from_utf8_lossy(&cmd).replace('\0', " ")
            ));
        }
    }
    found
}

/// The pids of the cluster's Slurm daemons on this host (munged, slurmd, slurmctld and the
/// login's sshd), by what their command lines name. A session's sshd (the listener's child,
/// which bears its command line until it names itself after its user) is not a daemon.
fn daemon_pids(name: &str) -> Vec<(String, i32)> {
    let mut pids: Vec<(String, i32)> = [
        ("munged", "munged"),
        ("slurmd", "slurmd -D"),
        ("slurmctld", "slurmctld -D"),
        ("sshd", "sshd -D"),
    ]
    .into_iter()
    .flat_map(|(kind, needle)| {
        pids_naming(&[needle, &format!("/{name}/")])
            .into_iter()
            .map(move |(pid, _)| (kind.to_string(), pid))
    })
    .collect();
    let all: Vec<i32> = pids.iter().map(|(_, p)| *p).collect();
    pids.retain(|(_, p)| parent_of(*p).is_none_or(|parent| !all.contains(&parent)));
    pids.sort();
    pids
}

/// The parent of `pid`, from its stat (after the command's closing parenthesis).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// A control plane with embedded node agents, crashed (SIGKILL) and then restarted
/// (SIGTERM, as an upgrade does) while a team's job runs and a team member's session is
/// open: the cluster's daemons run on (the same processes, adopted by the new agents), the
/// session stays open, a process the team detached on the login (setsid, its parent gone)
/// runs on with the login, and the job completes with no restart. Stopped with
/// --stop-workloads, its agents end their Slurm daemons, the login's detached process and
/// the job's slurmstepd and processes with them: no process of the cluster's account is
/// left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workloads_outlive_a_control_plane_restart_and_end_with_a_stop_that_says_so() {
    let fleet = "[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = 1\ngpus_per_node = 1\n";
    let mut backend = Backend::start_with_fleet_and_args(fleet, &[]);
    let (key, tf) = one_node_team(&backend, "{}");
    tf.apply();
    let creds = credentials(&tf, TRAIN);
    let name = cluster_name(&creds);
    let client = Client::connect(&creds, &key);
    let uid: u32 = client.ok("id", &["-u"]).trim().parse().unwrap();
    // An embedded node of one simulated GPU declares 8 CPUs and 32 GiB by default.
    assert_eq!(
        client.ok("sinfo", &["-h", "-N", "-o", "%c %m"]).trim(),
        "8 32768"
    );
    // A job that runs until the team says so (a file in its home), across the restarts.
    let gate = format!("go-{}", unique_name());
    let job = client
        .ok(
            "sbatch",
            &[
                "--parsable",
                "-N1",
                "--output=/dev/null",
                "--wrap",
                &format!("while [ ! -e $HOME/{gate} ]; do sleep 0.2; done; sleep 600"),
            ],
        )
        .trim()
        .to_string();
    client.wait_running(std::slice::from_ref(&job)).await;
    let mut session = client.hold("while sleep 0.2; do :; done");
    client.ok(
        "sh",
        &[
            "-c",
            "setsid sh -c 'exec sleep 3003' </dev/null >/dev/null 2>&1 &",
        ],
    );
    let detached = || {
        processes_of(uid)
            .into_iter()
            .filter(|p| p.contains("sleep 3003"))
            .filter_map(|p| p.split(' ').next().map(str::to_string))
            .collect::<Vec<_>>()
    };
    let before = detached();
    assert_eq!(before.len(), 1, "the detached process: {before:?}");
    let daemons = daemon_pids(&name);
    assert_eq!(
        daemons.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        ["munged", "slurmctld", "slurmd", "sshd"],
        "one of each daemon of the cluster: {daemons:?}"
    );

    backend.crash();
    backend.start_again();
    nodes_ready(&backend, 1).await;
    backend.restart();
    nodes_ready(&backend, 1).await;
    // The agents adopt what runs: nothing is started again.
    eventually("the cluster running again", LIMIT, || {
        let state = client.poll("scontrol", &["show", "job", &job]);
        async move {
            state
                .is_some_and(|s| s.contains("JobState=RUNNING"))
                .then_some(())
        }
    })
    .await;
    assert_eq!(
        daemon_pids(&name),
        daemons,
        "the same daemons after a crash and a restart of serve\n--- serve log ---\n{}",
        backend.log()
    );
    assert!(
        session.try_wait().unwrap().is_none(),
        "the team's session stayed open"
    );
    assert_eq!(
        detached(),
        before,
        "the detached process runs on with its login"
    );
    let _ = session.kill();
    let _ = session.wait();
    // The job goes on to its end: not requeued, not restarted.
    client.ok("touch", &[&gate]);
    let shown = client.ok("scontrol", &["show", "job", &job]);
    assert!(shown.contains("Restarts=0"), "{shown}");
    assert!(shown.contains("JobState=RUNNING"), "{shown}");
    client.ok("scancel", &[&job]);
    eventually("the job ended", LIMIT, || {
        let out = client.poll("squeue", &["-h", "-j", &job]);
        async move { out.is_some_and(|o| o.trim().is_empty()).then_some(()) }
    })
    .await;

    // From here on a stop ends the node's work.
    backend.restart_with_args(&["--stop-workloads"]);
    nodes_ready(&backend, 1).await;
    let job = client.ok(
        "sbatch",
        &[
            "--parsable",
            "-N1",
            "--output=/dev/null",
            "--wrap",
            "sleep 600",
        ],
    );
    client.wait_running(&[job.trim().to_string()]).await;
    drop(client);
    // RUNNING comes before the script starts (its job container is made first).
    eventually("the job's process running as the account", LIMIT, || {
        let running = processes_of(uid).iter().any(|p| p.contains("sleep 600"));
        async move { running.then_some(()) }
    })
    .await;
    let stepds: Vec<i32> = pids_naming(&["slurmstepd"])
        .into_iter()
        .map(|(pid, _)| pid)
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| String::from_utf8_lossy(&env).contains(&format!("/{name}/")))
        })
        .collect();
    assert!(
        !stepds.is_empty(),
        "the job has a slurmstepd of its cluster"
    );

    backend.terminate();
    eventually("no process of the cluster's account", LIMIT, || {
        let left = processes_of(uid);
        async move { left.is_empty().then_some(()) }
    })
    .await;
    eventually("no slurmstepd of the cluster's job", LIMIT, || {
        let left: Vec<String> = stepds
            .iter()
            .filter_map(|pid| fs::read_to_string(format!("/proc/{pid}/status")).ok())
            // A zombie is gone already; it only waits for its parent to reap it.
            .filter(|s| {
                !s.lines()
                    .any(|l| l.starts_with("State:") && l.contains('Z'))
            })
            .collect();
        async move { left.is_empty().then_some(()) }
    })
    .await;
    assert!(
        processes_naming(&name).is_empty(),
        "{:?}",
        processes_naming(&name)
    );
}

/// A host whose agent is gone for good (killed, its certificate revoked, the node retired)
/// keeps its clusters' daemons and jobs running: `gpufleet-agent node --clean` on it ends
/// and removes everything of them, the account, runtime directory and munge key included,
/// and is refused while an agent runs on the data dir.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_clean_removes_what_a_gone_agent_left_running() {
    let backend = Backend::start_external("30s", "5m");
    let mut agent = NodeAgent::start(&backend, "n1", &["--gpus", "1"]);
    nodes_ready(&backend, 1).await;
    let (key, tf) = one_node_team(&backend, "{}");
    tf.apply();
    let creds = credentials(&tf, TRAIN);
    let name = cluster_name(&creds);
    let client = Client::connect(&creds, &key);
    let job = client.ok(
        "sbatch",
        &[
            "--parsable",
            "-N1",
            "--output=/dev/null",
            "--wrap",
            "sleep 600",
        ],
    );
    client.wait_running(&[job.trim().to_string()]).await;
    let clean = |agent: &NodeAgent| {
        Command::new(gpufleet_e2e::binaries::agent())
            .args(["node", "--clean", "--name", "n1", "--data-dir"])
            .arg(agent.data_dir())
            .output()
            .expect("run node --clean")
    };
    let refused = clean(&agent);
    assert!(!refused.status.success(), "refused while the agent runs");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("stop the node agent"),
        "{refused:?}"
    );

    agent.kill9();
    assert!(
        !processes_naming(&format!("/{name}/")).is_empty(),
        "the cluster's daemons outlive the killed agent"
    );
    let cleaned = clean(&agent);
    assert!(cleaned.status.success(), "{cleaned:?}");
    assert!(
        String::from_utf8_lossy(&cleaned.stdout).contains(&format!("cluster {name}")),
        "{cleaned:?}"
    );
    assert_eq!(
        processes_naming(&format!("/{name}/")),
        Vec::<String>::new(),
        "no daemon or job of the cluster left"
    );
    assert!(!agent.data_dir().join("slurm").join(&name).exists());
    assert!(!std::path::Path::new("/run/gpufleet").join(&name).exists());
    let account = Command::new("getent")
        .args(["passwd", &name])
        .output()
        .unwrap();
    assert!(!account.status.success(), "the cluster's account is gone");
}

/// A layout change whose update runs out of time while a job still runs on a drained node
/// fails saying so, and changes nothing: the job runs on, the node keeps its slices and is
/// back in service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_change_that_outlasts_its_timeout_fails_and_changes_nothing() {
    let held = HeldJob::start("lay2", "outlast").await;
    let (tf, client, home, tag, job) = (&held.tf, &held.client, &held.home, &held.tag, &held.job);

    let short = single(1, r#"{ "1g.10gb" = 7 }"#).replace(
        "  depends_on",
        "  timeouts {\n    update = \"15s\"\n  }\n  depends_on",
    );
    tf.write_main(&short);
    let failed = tf.apply_fails();
    let said = failed
        .output()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    for want in [
        "mig_layout: the nodes were drained",
        "lay2 is still draining",
        "the layout was not changed",
    ] {
        assert!(said.contains(want), "no {want:?} in {failed}");
    }
    let (_, queue) = client.run("squeue", &["-h", "-j", job, "-o", "%T"]);
    assert_eq!(queue.trim(), "RUNNING", "the job runs on");
    client
        .wait_nodes(
            "the node back in service with its old slices",
            "lay2 mixed gpu:3g.40gb:2",
        )
        .await;
    fs::write(home.join(format!("{tag}-go")), "").unwrap();
    eventually("the job done", LIMIT, || {
        let done = home.join(format!("{tag}-done")).exists();
        async move { done.then_some(()) }
    })
    .await;
    held.end();
}

/// A node whose name would make its job steps' socket paths too long (they are
/// `<spool>/<node>_<job>.<step>`, at most 108 bytes) is refused when its slurmd would
/// start, naming the longest name that fits, instead of holding every batch job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_name_too_long_for_slurm_sockets_is_refused_clearly() {
    let backend = Backend::start_external("30s", "5m");
    let long = format!("n{}", "x".repeat(49));
    let _agent = NodeAgent::start(&backend, &long, &["--gpus", "1"]);
    nodes_ready(&backend, 1).await;
    let (_key, tf) = one_node_team(&backend, "{}");
    let failed = tf.apply_fails();
    let said = failed
        .output()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    for want in [
        format!("node {long}: its job steps' sockets"),
        "give the node a name of at most 40 characters".to_string(),
    ] {
        assert!(said.contains(&want), "no {want:?} in {failed}");
    }
    tf.destroy();
}
