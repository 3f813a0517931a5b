//! Where team volumes are mounted on a node, as both ends know it: the control plane
//! names each cluster's `storage_path` by this rule and the agent mounts only under it.

/// The root of every team volume mount on a node. Under `/run`: a host that restarts
/// starts without them, and its agent gets them back when it rejoins.
pub const VOLUME_MOUNTS: &str = "/run/gpufleet/volumes";

/// Where the nodes of cluster `name` of tenant `tenant_id` see its volume.
pub fn mount_path(tenant_id: &str, name: &str) -> String {
    format!("{VOLUME_MOUNTS}/{tenant_id}/{name}")
}
