//! What a stopped agent leaves of its clusters on a host, ended and forgotten: for tests and
//! scripts that stop a control plane or an agent without destroying its clusters. The
//! daemons outlive their agent (see [`crate::daemon`]), so this ends them too, and
//! unmounts their homes (see [`crate::home_fs`]).

use std::path::Path;

use crate::account::{self, runtime_dir};
use crate::home_fs;
use crate::login_limits::LoginCgroup;
use crate::node_cgroup::NodeCgroup;

/// Ends and forgets every cluster a stopped agent ran Slurm daemons for
/// (`<data_dir>/slurm/<cluster>/`, and, for a control plane's data dir, its embedded agents'
/// `agents/*/slurm/<cluster>/`): its daemons, its jobs' steps, its logins' and nodes'
/// cgroups, its account, runtime directory and home mount.
pub fn forget_all_under(data_dir: &Path) {
    let embedded = std::fs::read_dir(data_dir.join("agents"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|agent| agent.path().join("slurm"));
    let entries = std::iter::once(data_dir.join("slurm"))
        .chain(embedded)
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flatten()
        .flatten();
    for e in entries {
        let name = e.file_name().to_string_lossy().to_string();
        if crate::valid_cluster_name(&name) && name.starts_with("gf") {
            // The daemons, then the steps of the jobs they ran (which hold a slurm.conf of
            // the cluster's runtime directory).
            crate::daemon::end_kept_under(&e.path());
            account::kill_environ_prefix(&format!("SLURM_CONF={}/", runtime_dir(&name).display()));
            for login in LoginCgroup::every_of(&name) {
                login.remove();
            }
            for node in NodeCgroup::every_of(&name) {
                node.remove();
            }
            if let Err(e) = account::forget(&name) {
                tracing::warn!(cluster = %name, error = %e, "cannot remove a cluster's account");
            }
            let home = home_fs::lock_homes().and_then(|host| {
                let released = home_fs::release(&name);
                drop(host);
                released
            });
            if let Err(e) = home {
                tracing::warn!(cluster = %name, error = %e, "cannot unmount a cluster's home");
            }
        }
    }
}
