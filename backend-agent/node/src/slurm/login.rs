//! A cluster's login on this node (its head): an sshd at the node's address on the
//! cluster's login port, in the cluster's login sandbox (see `gpufleet_slurm::login`),
//! with the cluster's own host key. Its configuration and host key are in the agent's
//! private `<data-dir>/slurm/<cluster>/login/`; what the sessions read (the client
//! slurm.conf, whose munged is this node's, and the team's authorized keys, root's and
//! readable by the cluster's group) in the node's part of the runtime directory,
//! `/run/gpufleet/<cluster>/n<hash>/login/`. The team's keys and the client configuration
//! are rewritten in place (sshd and Slurm's commands read them at each use); a changed
//! address, port or host key restarts sshd, and its sessions end with it. sshd and every
//! session run in the login's cgroup, held to the agent's login limits
//! (`gpufleet_slurm::login_limits`), written again at each order so a change reaches a
//! running login.

use std::net::Ipv4Addr;
use std::path::Path;

use gpufleet_slurm::account::{self, Account};
use gpufleet_slurm::daemon::Daemon;
use gpufleet_slurm::login::{self, Files, Login};
use gpufleet_slurm::login_limits::{LoginCgroup, LoginLimits};

pub struct Running {
    sshd: Daemon,
    cgroup: LoginCgroup,
    config: String,
    host_key: String,
    at: std::net::SocketAddr,
}

impl Running {
    /// Where it listens.
    pub fn at(&self) -> std::net::SocketAddr {
        self.at
    }

    /// Stops sshd; the team's sessions (they run as the cluster's account) end with it,
    /// and its cgroup goes.
    pub fn stop(self) {
        account::kill_descendants(self.sshd.pid());
        self.sshd.stop();
        self.cgroup.remove();
    }
}

/// What this node's login of one cluster should run.
pub struct Spec<'a> {
    pub cluster: &'a str,
    /// Its private dir (sshd_config, host key, pid, log).
    pub dir: &'a Path,
    /// Its part of the node's runtime directory.
    pub runtime: &'a Path,
    pub account: &'a Account,
    pub address: Ipv4Addr,
    pub port: u16,
    pub keys: &'a [String],
    /// The cluster's host key (an OpenSSH private key).
    pub host_key: &'a str,
    /// What the login and all its sessions may use together.
    pub limits: &'a LoginLimits,
    /// This node's part of the runtime directory (`n<hash>`), which names its cgroup.
    pub node: &'a str,
    /// The sessions' slurm.conf (the shared one with this node's munged socket).
    pub client_conf: String,
    /// The team volume mounts the sessions see (their own tenant's).
    pub volumes: Option<gpufleet_slurm::sandbox::Volumes>,
    /// The home mounts the sessions see (their own cluster's).
    pub homes: Option<gpufleet_slurm::sandbox::Volumes>,
}

/// Runs (or verifies, or adopts from a former agent) the login as `want` says.
pub fn ensure(current: Option<Running>, want: &Spec) -> Result<Running, String> {
    let uid = want.account.uid;
    account::own_dir(want.dir, 0, 0, 0o700)?;
    account::own_dir(want.runtime, 0, uid, 0o750)?;
    let client_conf = want.runtime.join("slurm.conf");
    account::write_shared(&client_conf, &want.client_conf, uid, 0o640)?;
    let keys_file = want.runtime.join("authorized_keys");
    account::write_shared(&keys_file, &login::authorized_keys(want.keys), uid, 0o640)?;
    let files = Files::in_dir(want.dir);
    let spec = Login {
        addr: want.address.to_string(),
        port: want.port,
        user: want.account.name.clone(),
        slurm_conf: client_conf,
        authorized_keys: keys_file,
        volumes: want.volumes.clone(),
        homes: want.homes.clone(),
    };
    let config = login::sshd_config(&spec, &files);
    let cgroup = LoginCgroup::of(want.cluster, want.node);
    match current {
        Some(r) if r.config == config && r.host_key == want.host_key && r.sshd.alive() => {
            cgroup.apply(want.limits)?;
            return Ok(r);
        }
        // Its cgroup goes with it, and is made again below.
        Some(r) => r.stop(),
        None => {}
    }
    cgroup.apply(want.limits)?;
    let (name, identity) = (
        format!("sshd/{}", want.cluster),
        login::identity(&config, want.host_key),
    );
    // The sshd a former agent started as this order says runs on, and its sessions with it.
    let sshd = match login::adopt(&name, &spec, &files, &cgroup, &identity) {
        Some(sshd) => sshd,
        None => {
            login::write_host_key(&files, want.host_key)?;
            super::write(&files.config, &config)?;
            login::start(&name, &spec, &files, &cgroup, &identity)?
        }
    };
    Ok(Running {
        sshd,
        cgroup,
        config,
        host_key: want.host_key.to_string(),
        at: std::net::SocketAddr::from((want.address, want.port)),
    })
}
