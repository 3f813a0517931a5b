# Every node the caller may see: with the admin token the whole fleet, with a
# tenant token the nodes of that tenant's clusters.
data "gpufleet_nodes" "all" {}

# Only the H100 nodes.
data "gpufleet_nodes" "h100" {
  gpu_type = "H100-80GB"
}

# H100 pool nodes no cluster runs on (nodes reserved but not yet drawn by a
# cluster are among them); with the admin token, as a tenant sees none of them.
output "unassigned_h100_pool_hostnames" {
  value = [
    for n in data.gpufleet_nodes.h100.nodes : n.hostname
    if n.capacity == "pool" && n.cluster_id == ""
  ]
}
