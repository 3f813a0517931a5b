output "tenant_id" {
  description = "The team's tenant id."
  value       = gpufleet_tenant.this.id
}

output "reservation_id" {
  description = "The team's reservation id, or null without a reservation."
  value       = one(gpufleet_reservation.this[*].id)
}

output "cluster_id" {
  description = "The team's cluster id."
  value       = gpufleet_tenant_cluster.this.id
}

output "cluster_endpoint" {
  description = "Kubernetes API server URL, or the Slurm cluster's login (its sshd) as host:port."
  value       = gpufleet_tenant_cluster.this.endpoint
}

output "node_hostnames" {
  description = "Hostnames of the cluster's nodes."
  value       = gpufleet_tenant_cluster.this.nodes[*].hostname
}

output "storage_path" {
  description = "Where the cluster's dedicated volume is mounted."
  value       = gpufleet_tenant_cluster.this.storage_path
}

# Each GPU's MIG devices (the cluster itself counts them per node, in `mig_instances`).
data "gpufleet_nodes" "this" {
  cluster_id = gpufleet_tenant_cluster.this.id
  depends_on = [gpufleet_tenant_cluster.this]
}

output "gpu_partitions" {
  description = "Per node, each GPU's MIG devices as \"profile@start\" (empty for a whole GPU)."
  value = {
    for node in data.gpufleet_nodes.this.nodes : node.hostname => [
      for gpu in node.gpus : join(" ", [for d in gpu.mig_devices : "${d.profile}@${d.start}"])
    ]
  }
}
