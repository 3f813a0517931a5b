//! Slurm across hosts apart (issues 20 and 28), on the multi-host tier
//! (`gpufleet_e2e::netns`): a control-plane host that runs nothing of any team, four GPU
//! hosts each running a node agent (and, for its cluster, munged and slurmd; on a
//! cluster's head node also its controller and login), and a client host where the team
//! works with only what it is given: its ssh key and the cluster's `credentials`.
//!
//! - The login is on one of the cluster's own nodes (its head), at that host's address;
//!   the control plane's host runs no slurmctld, sshd or munged and has no account of the
//!   cluster.
//! - `srun -N3 hostname` from the client host, through the login, answers from the three
//!   GPU hosts by their own hostnames; `sinfo` shows each node's MIG slices as GRES, and
//!   four one-slice batch jobs on one node run at once (each waits for the other three).
//! - The team's credentials reach its own controller alone: its key is refused by the
//!   other team's login, and its munge credentials by the other team's controller.
//! - Storage without shared storage: a job writes into `storage_path` on its node, a
//!   volume of the node's own (`storage_gib`, the team's, 0700; not on the other nodes),
//!   and `storage_used_gib` follows; `storage_retention = "keep"` is refused at plan time.
//! - A layout change with a job running drains its node, lets the job finish, then
//!   re-partitions every node.
//! - Destroy with a job running: no process and no file of the cluster stays on any host
//!   (each host's own process table, data dirs and `/run`; no volume image, mount or loop
//!   device), and the account is gone.
//!
//! Needs root (CI runs as root); without it the test fails naming what is missing.

use std::fs;
use std::time::Duration;

use gpufleet_e2e::multihost::{Fleet, ONE_GPU_HOST};
use gpufleet_e2e::netns::{self, Host};
use gpufleet_e2e::slurm_login::{credentials, shell_word, team_key, Session};
use gpufleet_e2e::{eventually, Terraform};

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(90);
const VISION: &str = "gpufleet_tenant_cluster.vision";
const SPEECH: &str = "gpufleet_tenant_cluster.speech";
const GPU_HOSTS: [&str; 4] = ["g1", "g2", "g3", "g4"];

fn config() -> String {
    r#"
resource "gpufleet_tenant" "vision" {
  name = "vision"
}
resource "gpufleet_gpu_quota" "vision" {
  tenant   = gpufleet_tenant.vision.name
  gpu_type = "H100-80GB"
  gpus     = 3
}
resource "gpufleet_tenant_cluster" "vision" {
  tenant          = gpufleet_tenant.vision.name
  name            = "train"
  orchestrator    = "slurm"
  gpu_type        = "H100-80GB"
  node_count      = 3
  mig_layout      = { "1g.10gb" = 4 }
  storage_gib     = 1
  ssh_public_keys = [file("${path.module}/vision.pub")]
  depends_on      = [gpufleet_gpu_quota.vision]
}
resource "gpufleet_tenant" "speech" {
  name = "speech"
}
resource "gpufleet_gpu_quota" "speech" {
  tenant   = gpufleet_tenant.speech.name
  gpu_type = "H100-80GB"
  gpus     = 1
}
resource "gpufleet_tenant_cluster" "speech" {
  tenant          = gpufleet_tenant.speech.name
  name            = "asr"
  orchestrator    = "slurm"
  gpu_type        = "H100-80GB"
  node_count      = 1
  ssh_public_keys = [file("${path.module}/speech.pub")]
  depends_on      = [gpufleet_gpu_quota.speech]
}
"#
    .to_string()
}

fn sorted_lines(out: &str) -> Vec<String> {
    let mut lines: Vec<String> = out.lines().map(|l| l.trim().to_string()).collect();
    lines.sort();
    lines
}

/// The uids of a host's processes but its holder's.
fn uid_of(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// What of Slurm cluster `name` a host still holds: processes of its account, and files
/// under `dirs` or the host's own `/run` that name it or mention it.
fn leftovers(host: &Host, uid: u32, name: &str, dirs: &[std::path::PathBuf]) -> Vec<String> {
    let mut found: Vec<String> = host
        .processes()
        .into_iter()
        .filter(|(p, _)| uid_of(*p) == Some(uid))
        .map(|(p, comm)| format!("{}: process {p} {comm}", host.name()))
        .collect();
    let mut roots: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    roots.push("/run".into());
    for root in roots {
        let named = host.run("find", &[&root, "-name", &format!("*{name}*")]);
        let grep = host.run("grep", &["-rl", name, &root]);
        for out in [named.stdout, grep.stdout] {
            found.extend(
                String::from_utf8_lossy(&out)
                    .lines()
                    .map(|l| format!("{}: {l}", host.name())),
            );
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slurm_cluster_spans_hosts_and_its_team_reaches_only_its_own_controller() {
    netns::require("the multi-host Slurm tests");
    let Fleet {
        net,
        backend,
        agents,
    } = Fleet::start(&GPU_HOSTS, &[], &ONE_GPU_HOST, LIMIT).await;
    let (cp, client) = (net.host("cp"), net.host("client"));
    let mut names = vec!["cp", "client"];
    names.extend(GPU_HOSTS);

    // Terraform and the teams' keys live on the client host.
    let (vision_key, vision_pub) = team_key(client, "vision");
    let (speech_key, speech_pub) = team_key(client, "speech");
    let tf = Terraform::on_host(client, &backend, backend.admin_token());
    tf.keep_credentials_in_state(); // reads the deprecated attributes
    tf.write_file("vision.pub", &vision_pub);
    tf.write_file("speech.pub", &speech_pub);
    tf.write_main(&config());
    tf.init();
    tf.apply();
    let vision = credentials(&tf, VISION);
    let speech = credentials(&tf, SPEECH);
    let nodes: Vec<String> = tf.resource(VISION)["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["hostname"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(nodes.len(), 3);
    // The login is on the cluster's head node, by that host's address, and the head is
    // one of the cluster's own nodes: the first by name.
    let head = vision["login_node"].as_str().unwrap().to_string();
    assert_eq!(Some(&head), nodes.iter().min(), "{vision}");
    assert_eq!(
        vision["host"].as_str(),
        Some(net.host(&head).addr().to_string().as_str()),
        "the login is at its head node's address: {vision}"
    );
    // The control plane's host runs nothing of any team: no Slurm, munge or ssh daemon.
    let on_cp: Vec<String> = cp
        .processes()
        .into_iter()
        .map(|(_, comm)| comm)
        .filter(|c| c != "gpufleet-agent")
        .collect();
    assert!(on_cp.is_empty(), "the control plane's host runs {on_cp:?}");
    for (team, creds) in [("vision", &vision), ("speech", &speech)] {
        let at = creds["login_node"].as_str().unwrap();
        let daemons: Vec<String> = net
            .host(at)
            .processes()
            .into_iter()
            .map(|(_, comm)| comm)
            .collect();
        for d in ["slurmctld", "sshd", "slurmd", "munged"] {
            assert!(
                daemons.iter().any(|c| c == d),
                "{team}'s head {at} runs no {d}: {daemons:?}"
            );
        }
    }
    let team = Session::new(client, &vision, &vision_key);

    // Every node answers from its own host: the hostname is the host's (its own UTS
    // namespace), so the step really ran there.
    let answered = team.ok("srun -N3 hostname");
    let mut expected = nodes.clone();
    expected.sort();
    assert_eq!(sorted_lines(&answered), expected, "{answered}");
    let gres = team.ok("sinfo -h -N -o '%N %G'");
    for node in &nodes {
        assert!(
            gres.lines()
                .any(|l| l.trim() == format!("{node} gpu:1g.10gb:4")),
            "{gres}"
        );
    }
    // Four one-slice jobs on one node run at once: each waits until all four started.
    let first = &nodes[0];
    let script = "touch $HOME/mh-m-$SLURM_JOB_ID; \
         until [ $(ls $HOME | grep -c '^mh-m-') -ge 4 ]; do sleep 0.1; done";
    let jobs: Vec<String> = (0..4)
        .map(|_| {
            team.ok(&format!(
                "sbatch --parsable -N1 --nodelist={first} --gres=gpu:1g.10gb:1 --output=/dev/null --wrap {}",
                shell_word(script)
            ))
            .trim()
            .to_string()
        })
        .collect();
    let seen = std::sync::Mutex::new(String::new());
    let waited = tokio::time::timeout(
        LIMIT,
        eventually("the four jobs to end together", LIMIT * 2, || {
            let all = team.poll("scontrol -o show job").unwrap_or_default();
            let completed = all
                .lines()
                .filter(|l| {
                    jobs.iter().any(|j| l.starts_with(&format!("JobId={j} ")))
                        && l.contains("JobState=COMPLETED")
                })
                .count();
            *seen.lock().unwrap() = all;
            async move { (completed == 4).then_some(()) }
        }),
    )
    .await;
    assert!(
        waited.is_ok(),
        "the four jobs did not all complete; last seen:\n{}",
        seen.lock().unwrap()
    );

    // Storage without shared storage: each node has a volume of its own of storage_gib at
    // storage_path, the team account's and 0700; what a job writes there stays on its
    // node, and storage_used_gib follows the fullest node's volume.
    let storage = tf.resource(VISION)["storage_path"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(tf.resource(VISION)["storage_used_gib"].as_i64(), Some(0));
    let account = team.ok("id -u").trim().to_string();
    let wrote = team.ok(&format!(
        "srun -N1 -w {first} sh -c {}",
        shell_word(&format!(
            "stat -c '%u %a' {storage} && df -B1 --output=size {storage} | tail -1 \
             && head -c 64M /dev/zero > {storage}/written && sync"
        ))
    ));
    let mut said = wrote.lines().map(str::trim);
    assert_eq!(
        said.next(),
        Some(format!("{account} 700").as_str()),
        "{wrote}"
    );
    let size: u64 = said.next().unwrap_or_default().parse().unwrap_or(0);
    assert!(
        size > (1 << 30) / 10 * 9 && size <= 1 << 30,
        "a 1 GiB volume: {wrote}"
    );
    let elsewhere = team.ok(&format!("srun -N1 -w {} ls -A {storage}", nodes[1]));
    assert!(!elsewhere.contains("written"), "not shared: {elsewhere}");
    eventually("storage_used_gib to follow the job's write", LIMIT, || {
        tf.refresh();
        let used = tf.resource(VISION)["storage_used_gib"].as_i64();
        async move { (used == Some(1)).then_some(()) }
    })
    .await;
    // Nothing can keep a node's own volume for a later cluster: refused at plan time.
    tf.write_main(&config().replace(
        "  storage_gib     = 1\n",
        "  storage_gib     = 1\n  storage_retention = \"keep\"\n",
    ));
    tf.plan_fails()
        .assert_mentions(&["storage_retention", "--shared-storage"]);
    tf.write_main(&config());

    // The team's credentials reach its own controller alone. Speech's own key logs in to
    // speech's login; vision's is refused there.
    let theirs = Session::new(client, &speech, &speech_key);
    assert_ne!(theirs.ok("id -u").trim(), "0");
    let (ok, out) = Session::new(client, &speech, &vision_key).run("id");
    assert!(!ok, "vision's key logged in to speech's login: {out}");
    // Speech's controller, where its own configuration says it is (what an attacker
    // would find by scanning the hosts' ports).
    let theirs_conf = theirs.ok("cat \"$SLURM_CONF\"");
    let speech_port = theirs_conf
        .lines()
        .find_map(|l| l.strip_prefix("SlurmctldPort="))
        .expect("SlurmctldPort")
        .trim()
        .to_string();
    let speech_host = theirs_conf
        .lines()
        .find(|l| l.starts_with("SlurmctldHost="))
        .expect("SlurmctldHost")
        .trim()
        .to_string();
    let (ok, out) = team.run(&format!(
        "sed -e 's/^ClusterName=.*/ClusterName={}/' -e 's/^SlurmctldPort=.*/SlurmctldPort={speech_port}/' -e 's/^SlurmctldHost=.*/{speech_host}/' \"$SLURM_CONF\" > $HOME/theirs.conf && SLURM_CONF=$HOME/theirs.conf sinfo",
        speech["cluster"].as_str().unwrap()
    ));
    assert!(
        !ok,
        "speech's controller answered vision's credentials: {out}"
    );
    // From the client host itself, with the team's own slurm.conf (which it may read on
    // its login) but no munge key, its controller does not answer either: the login is
    // the only way in.
    let own_conf = client.dir().join("vision-slurm.conf");
    fs::write(&own_conf, team.ok("cat \"$SLURM_CONF\"")).unwrap();
    let bare = client
        .command("sinfo")
        .env("SLURM_CONF", &own_conf)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&bare.stderr);
    assert!(!bare.status.success(), "sinfo from the client host: {said}");
    assert!(said.to_lowercase().contains("munge"), "{said}");

    // A layout change with a job running: its node is drained, the job finishes on its
    // slice, then the GPUs are re-partitioned. The job waits for a file the test makes on
    // its node's host (each host has its own home) once the node drains.
    let held_on = nodes[2].clone();
    let held = team
        .ok(&format!(
            "sbatch --parsable -N1 --nodelist={held_on} --gres=gpu:1g.10gb:1 --output=/dev/null --wrap {}",
            shell_word("until [ -e $HOME/mh-go ]; do sleep 0.1; done")
        ))
        .trim()
        .to_string();
    eventually("the held job running", LIMIT, || {
        let state = team.poll(&format!("squeue -h -j {held} -o %T"));
        async move { state.is_some_and(|s| s.trim() == "RUNNING").then_some(()) }
    })
    .await;
    let home = vision["home"].as_str().unwrap().to_string();
    tf.write_main(&config().replace(r#"{ "1g.10gb" = 4 }"#, r#"{ "3g.40gb" = 2 }"#));
    std::thread::scope(|s| {
        let apply = s.spawn(|| tf.apply());
        gpufleet_e2e::node_agent::wait_for("the held job's node draining", LIMIT, || {
            let out = team.poll("sinfo -h -N -o '%N %T'")?;
            out.lines()
                .any(|l| l.trim() == format!("{held_on} draining"))
                .then_some(())
        });
        let state = team.ok(&format!("squeue -h -j {held} -o %T"));
        assert_eq!(
            state.trim(),
            "RUNNING",
            "the job runs on while its node drains"
        );
        let go = net.host(&held_on).run("touch", &[&format!("{home}/mh-go")]);
        assert!(go.status.success(), "{go:?}");
        apply
            .join()
            .expect("the layout change applies once the job is done");
    });
    let shown = team.ok(&format!("scontrol show job {held}"));
    assert!(shown.contains("JobState=COMPLETED"), "{shown}");
    eventually("every node with its new slices", LIMIT, || {
        let gres = team.poll("sinfo -h -N -o '%N %T %G'").unwrap_or_default();
        let all = nodes.iter().all(|n| {
            gres.lines()
                .any(|l| l.trim() == format!("{n} idle gpu:3g.40gb:2"))
        });
        async move { all.then_some(()) }
    })
    .await;

    // Destroy with a job running: nothing of the cluster stays on any host.
    let vision_name = vision["cluster"].as_str().unwrap().to_string();
    let uid: u32 = team.ok("id -u").trim().parse().unwrap();
    for h in &nodes {
        let account = net.host(h).run("getent", &["passwd", &uid.to_string()]);
        assert!(account.status.success(), "{h} has no account {uid}");
    }
    let account = cp.run("getent", &["passwd", &uid.to_string()]);
    assert!(
        !account.status.success(),
        "the control plane's host has the team's account"
    );
    let long = team.ok(&format!(
        "sbatch --parsable -N1 --nodelist={} --output=/dev/null --wrap 'sleep 600'",
        nodes[1]
    ));
    eventually("the long job running", LIMIT, || {
        let state = team.poll(&format!("squeue -h -j {} -o %T", long.trim()));
        async move { state.is_some_and(|s| s.trim() == "RUNNING").then_some(()) }
    })
    .await;
    // The probe sees the cluster while it is there: the job's processes and the node's
    // runtime files on its host.
    // (RUNNING comes before the job's script starts: its job container is made first.)
    let busy = GPU_HOSTS.iter().position(|h| *h == nodes[1]).unwrap();
    eventually(
        "the probe seeing the running job on its host",
        LIMIT,
        || {
            let before = leftovers(
                net.host(&nodes[1]),
                uid,
                &vision_name,
                &[agents[busy].data_dir()],
            );
            let seen = before.iter().any(|l| l.contains("process"))
                && before.iter().any(|l| l.contains("/run/"));
            async move { seen.then_some(()) }
        },
    )
    .await;
    tf.destroy();
    let mut held = Vec::new();
    for (h, agent) in GPU_HOSTS.iter().zip(&agents) {
        held.extend(leftovers(
            net.host(h),
            uid,
            &vision_name,
            &[agent.data_dir()],
        ));
    }
    // The control plane's store keeps the cluster's history (its events); its Slurm
    // directory (the controller's state and keys) must be gone.
    held.extend(leftovers(
        cp,
        uid,
        &vision_name,
        &[backend.data_dir().join("slurm")],
    ));
    assert!(held.is_empty(), "left after destroy: {held:#?}");
    // Every node's volume is gone with the cluster: no image, no mount, no loop device.
    for (h, agent) in GPU_HOSTS.iter().zip(&agents) {
        let volumes = agent.data_dir().join("volumes");
        let images = net
            .host(h)
            .run("find", &[&volumes.display().to_string(), "-type", "f"]);
        assert!(images.stdout.is_empty(), "{h}: {images:?}");
        let mounts = net.host(h).run("cat", &["/proc/self/mountinfo"]);
        let mounts = String::from_utf8_lossy(&mounts.stdout);
        assert!(!mounts.contains("/run/gpufleet/volumes/"), "{h}: {mounts}");
    }
    eventually("the volumes' loop devices detached", LIMIT, || {
        let loops = std::process::Command::new("losetup")
            .args(["-l", "-n", "-O", "BACK-FILE"])
            .output()
            .unwrap();
        let loops = String::from_utf8_lossy(&loops.stdout).to_string();
        let ours = agents
            .iter()
            .any(|a| loops.contains(&a.data_dir().display().to_string()));
        async move { (!ours).then_some(()) }
    })
    .await;
    // Each host has its own user database: the account is gone from every one (and
    // was there on the hosts that ran the cluster).
    for h in names.iter() {
        let account = net.host(h).run("getent", &["passwd", &uid.to_string()]);
        assert!(
            !account.status.success(),
            "{h} keeps the cluster's account: {}",
            String::from_utf8_lossy(&account.stdout)
        );
    }
    // Each GPU host runs its agent alone again.
    for (h, agent) in GPU_HOSTS.iter().zip(&agents) {
        let processes = net.host(h).processes();
        assert_eq!(
            processes.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
            vec![agent.pid().unwrap()],
            "{h}: {processes:?}"
        );
    }
}

/// A Slurm node's host cut off (not the head's): the node is replaced on another host and
/// the cluster runs again; healed, the old host's agent learns from the control plane that its node left
/// the cluster and ends everything of it there (slurmd, munged, the cluster's key, config
/// and home), and the team's next `srun` runs on the nodes the cluster has now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_slurm_node_is_replaced_and_once_healed_keeps_nothing_of_the_cluster() {
    netns::require("the multi-host Slurm tests");
    let gpu_hosts = ["g1", "g2", "g3"];
    let Fleet {
        net,
        backend,
        agents,
    } = Fleet::start(
        &gpu_hosts,
        &["--node-timeout", "2s", "--replace-after", "1s"],
        &[&ONE_GPU_HOST[..], &["--keepalive", "1s"]].concat(),
        LIMIT,
    )
    .await;
    let client = net.host("client");
    let (key, public) = team_key(client, "vision");
    let tf = Terraform::on_host(client, &backend, backend.admin_token());
    tf.keep_credentials_in_state(); // reads the deprecated attributes
    tf.write_file("vision.pub", &public);
    let two_nodes = config()
        .split("resource \"gpufleet_tenant\" \"speech\"")
        .next()
        .unwrap()
        .replace("gpus     = 3", "gpus     = 2")
        .replace("node_count      = 3", "node_count      = 2");
    tf.write_main(&two_nodes);
    tf.init();
    tf.apply();
    let creds = credentials(&tf, VISION);
    let name = creds["cluster"].as_str().unwrap().to_string();
    let team = Session::new(client, &creds, &key);
    let uid: u32 = team.ok("id -u").trim().parse().unwrap();
    let held: Vec<String> = sorted_lines(&team.ok("srun -N2 hostname"));
    // A node that is not the cluster's head (which runs its controller and login: see
    // multihost_slurm_head.rs for a lost head).
    let head = creds["login_node"].as_str().unwrap();
    let cut = held.iter().find(|h| *h != head).unwrap().clone();
    let at = gpu_hosts.iter().position(|h| *h == cut).unwrap();
    let cut_host = net.host(&cut);
    assert!(
        !leftovers(cut_host, uid, &name, &[agents[at].data_dir()]).is_empty(),
        "the node's host runs the cluster's daemons before the cut"
    );

    cut_host.cut();
    let spare = gpu_hosts
        .iter()
        .find(|h| !held.contains(&h.to_string()))
        .unwrap()
        .to_string();
    let mut now = held.clone();
    now.retain(|h| *h != cut);
    now.push(spare);
    now.sort();
    // The team sees the replacement in Slurm: a step on two nodes runs on the spare.
    eventually("srun on the replacement", LIMIT, || {
        let ran = team.poll("srun -N2 hostname").map(|o| sorted_lines(&o));
        let want = now.clone();
        async move { (ran == Some(want)).then_some(()) }
    })
    .await;

    cut_host.heal();
    // Back, told it left the cluster: nothing of the cluster on its host, its account
    // gone, and no process but the agent (the cleanup's own `userdel` included).
    let agent_pid = agents[at].pid().unwrap();
    eventually(
        "the healed host to keep nothing of the cluster",
        LIMIT,
        || {
            let left = leftovers(cut_host, uid, &name, &[agents[at].data_dir()]);
            let only_agent = cut_host
                .processes()
                .iter()
                .map(|(p, _)| *p)
                .collect::<Vec<_>>()
                == vec![agent_pid];
            let no_account = !cut_host
                .run("getent", &["passwd", &uid.to_string()])
                .status
                .success();
            async move { (left.is_empty() && only_agent && no_account).then_some(()) }
        },
    )
    .await;
    assert_eq!(sorted_lines(&team.ok("srun -N2 hostname")), now);
    tf.assert_no_changes();
    tf.destroy();
}
