//! A team's way into its Slurm cluster on the multi-host tier: its key pair, made on the
//! client host as a user makes one, and sessions to the login its cluster's `credentials`
//! name, run from that host as docs/guides/slurm.md shows (ssh as the cluster's user, the
//! login's host key checked against the credentials' known_hosts line).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::netns::{Host, Launcher};
use crate::{Backend, Terraform};

/// A safety net for one session's command (a hang, never a timing assertion).
const LIMIT: Duration = Duration::from_secs(90);

/// Team `team`'s tenant (`team-<team>`), a quota of one H100 and a one-node Slurm cluster
/// named `team` split in four 1g.10gb slices, reached with the key in `<team>.pub` beside
/// the configuration.
pub fn sliced_team(team: &str) -> String {
    format!(
        r#"
resource "gpufleet_tenant" "{team}" {{
  name = "team-{team}"
}}
resource "gpufleet_gpu_quota" "{team}" {{
  tenant   = gpufleet_tenant.{team}.name
  gpu_type = "H100-80GB"
  gpus     = 1
}}
resource "gpufleet_tenant_cluster" "{team}" {{
  tenant          = gpufleet_tenant.{team}.name
  name            = "{team}"
  orchestrator    = "slurm"
  gpu_type        = "H100-80GB"
  node_count      = 1
  mig_layout      = {{ "1g.10gb" = 4 }}
  ssh_public_keys = [file("${{path.module}}/{team}.pub")]
  depends_on      = [gpufleet_gpu_quota.{team}]
}}
"#
    )
}

/// Team `vision`'s tenant, a quota of two H100s and its two-node Slurm cluster `train`
/// (`gpufleet_tenant_cluster.vision`), reached with the key in `vision.pub` beside the
/// configuration; `extra`: more of the cluster's attributes, each on a line of its own.
pub fn two_node_vision(extra: &str) -> String {
    format!(
        r#"
resource "gpufleet_tenant" "vision" {{
  name = "vision"
}}
resource "gpufleet_gpu_quota" "vision" {{
  tenant   = gpufleet_tenant.vision.name
  gpu_type = "H100-80GB"
  gpus     = 2
}}
resource "gpufleet_tenant_cluster" "vision" {{
  tenant          = gpufleet_tenant.vision.name
  name            = "train"
  orchestrator    = "slurm"
  gpu_type        = "H100-80GB"
  node_count      = 2
{extra}  ssh_public_keys = [file("${{path.module}}/vision.pub")]
  depends_on      = [gpufleet_gpu_quota.vision]
}}
"#
    )
}

/// Team `vision` at work from `client`: its key pair made there, and a Terraform directory
/// with `hcl` (which reads the key as `vision.pub`, as [`two_node_vision`] does) initialized
/// and applied with the admin token. Returns Terraform and the team's private key.
pub fn vision_applied(client: &Host, backend: &Backend, hcl: &str) -> (Terraform, PathBuf) {
    let (key, public) = team_key(client, "vision");
    let tf = Terraform::on_host(client, backend, backend.admin_token());
    tf.keep_credentials_in_state(); // reads the deprecated attributes
    tf.write_file("vision.pub", &public);
    tf.write_main(hcl);
    tf.init();
    tf.apply();
    (tf, key)
}

/// A team's key pair in the client host's directory: (private key, public key text).
pub fn team_key(client: &Host, team: &str) -> (PathBuf, String) {
    team_key_in(client.dir(), team)
}

/// A team's key pair in `dir` (a team working on this machine itself).
pub fn team_key_in(dir: &Path, team: &str) -> (PathBuf, String) {
    let key = dir.join(format!("{team}_ed25519"));
    let made = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", team, "-f"])
        .arg(&key)
        .status()
        .expect("ssh-keygen (Debian's openssh-client)");
    assert!(made.success());
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    (key, public)
}

/// The Slurm cluster `address`'s credentials, as Terraform's state has them.
pub fn credentials(tf: &Terraform, address: &str) -> Value {
    serde_json::from_str(
        tf.resource(address)["credentials"]
            .as_str()
            .expect("credentials"),
    )
    .expect("Slurm credentials are JSON")
}

/// The hostnames of the nodes of the cluster at `address` in Terraform's state, sorted.
pub fn cluster_nodes(tf: &Terraform, address: &str) -> Vec<String> {
    let mut nodes: Vec<String> = tf.resource(address)["nodes"]
        .as_array()
        .expect("the cluster's nodes")
        .iter()
        .map(|n| n["hostname"].as_str().unwrap_or_default().to_string())
        .collect();
    nodes.sort();
    nodes
}

/// One word for the login's shell, whatever it holds.
pub fn shell_word(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// A team's ssh session to the login its credentials name.
pub struct Session {
    /// The host ssh runs on (None: this machine).
    from: Option<Launcher>,
    key: PathBuf,
    known_hosts: PathBuf,
    pub user: String,
    pub host: String,
    pub port: u16,
}

impl Session {
    /// From host `from` with the team's private `key`, as the credentials' user.
    pub fn new(from: &Host, credentials: &Value, key: &Path) -> Session {
        Session::open(Some(from.launcher()), from.dir(), credentials, key)
    }

    /// From this machine itself (the single-host tier), keeping its known_hosts in `dir`.
    pub fn here(dir: &Path, credentials: &Value, key: &Path) -> Session {
        Session::open(None, dir, credentials, key)
    }

    fn open(from: Option<Launcher>, dir: &Path, credentials: &Value, key: &Path) -> Session {
        let port = credentials["port"].as_u64().expect("port") as u16;
        let user = credentials["user"].as_str().expect("user").to_string();
        let host = credentials["host"].as_str().expect("host").to_string();
        let known_hosts = dir.join(format!("known_hosts-{user}-{host}-{port}"));
        std::fs::write(
            &known_hosts,
            format!(
                "{}\n",
                credentials["known_hosts"].as_str().expect("known_hosts")
            ),
        )
        .unwrap();
        Session {
            from,
            key: key.to_path_buf(),
            known_hosts,
            user,
            host,
            port,
        }
    }

    /// Runs `script` in the login's shell (killed after a limit): (success, stdout +
    /// stderr). A login that does not answer fails within seconds.
    pub fn run(&self, script: &str) -> (bool, String) {
        crate::commands::output_within(&mut self.ssh(script), script, LIMIT)
    }

    /// ssh to the login, running `script` there.
    fn ssh(&self, script: &str) -> Command {
        let mut ssh = match &self.from {
            Some(host) => host.command("ssh"),
            None => Command::new("ssh"),
        };
        ssh.args(["-i", &self.key.display().to_string()])
            .args(["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"])
            .args(["-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR"])
            .args(["-o", "ConnectTimeout=5"])
            .arg("-o")
            .arg(format!("UserKnownHostsFile={}", self.known_hosts.display()))
            .args(["-p", &self.port.to_string()])
            .arg(format!("{}@{}", self.user, self.host))
            .arg("--")
            .arg(script);
        ssh
    }

    /// A session that runs `script` in the login's shell until it ends (no limit: make
    /// the script end): a team member's open session. Its output is dropped.
    pub fn hold(&self, script: &str) -> std::process::Child {
        self.ssh(script)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn ssh")
    }

    /// `script`'s output; fails the test when it fails.
    pub fn ok(&self, script: &str) -> String {
        let (ok, out) = self.run(script);
        assert!(ok, "{script} on {}:{}: {out}", self.host, self.port);
        out
    }

    /// Runs `script` as a one-task job step on one of the cluster's nodes (`args`: more
    /// of `srun`'s options): (success, stdout + stderr).
    pub fn job(&self, args: &str, script: &str) -> (bool, String) {
        self.run(&format!("srun -N1 -n1 {args} sh -c {}", shell_word(script)))
    }

    /// [`Session::job`]'s output; fails the test when it fails.
    pub fn job_ok(&self, args: &str, script: &str) -> String {
        let (ok, out) = self.job(args, script);
        assert!(
            ok,
            "srun {args} {script} on {}:{}: {out}",
            self.host, self.port
        );
        out
    }

    /// For a wait: the output while the command succeeds.
    pub fn poll(&self, script: &str) -> Option<String> {
        let (ok, out) = self.run(script);
        ok.then_some(out)
    }

    /// The controllers as the session's slurm.conf names them (`SlurmctldHost[i]`), in
    /// order: the primary first.
    pub fn controllers(&self) -> Vec<String> {
        self.ok("scontrol show config")
            .lines()
            .filter(|l| l.starts_with("SlurmctldHost["))
            .filter_map(|l| l.split_once('=').map(|(_, v)| v.trim().to_string()))
            .collect()
    }
}
