# Every node the caller may see. With a tenant token, the holder (cluster_id,
# tenant_id) of nodes held by other tenants is hidden, so read free nodes with
# the admin token.
data "gpufleet_nodes" "all" {}

# Only the H100 nodes.
data "gpufleet_nodes" "h100" {
  gpu_type = "H100-80GB"
}

# H100 pool nodes no cluster runs on (nodes reserved but not yet drawn by a
# cluster are among them).
output "unassigned_h100_pool_hostnames" {
  value = [
    for n in data.gpufleet_nodes.h100.nodes : n.hostname
    if n.capacity == "pool" && n.cluster_id == ""
  ]
}
