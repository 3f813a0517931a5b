# Every node the caller may see: all nodes with an admin token; with a tenant
# token, free nodes and the tenant's own.
data "gpufleet_nodes" "all" {}

# Only the H100 nodes.
data "gpufleet_nodes" "h100" {
  gpu_type = "H100-80GB"
}

output "free_h100_hostnames" {
  value = [for n in data.gpufleet_nodes.h100.nodes : n.hostname if n.cluster_id == ""]
}
