output "tenant_id" {
  description = "The team's tenant id."
  value       = gpufleet_tenant.this.id
}

output "tenant_token" {
  description = "The team's bearer token (issued at create; null after an import)."
  value       = gpufleet_tenant.this.token
  sensitive   = true
}

output "cluster_id" {
  description = "The team's cluster id."
  value       = gpufleet_tenant_cluster.this.id
}

output "cluster_endpoint" {
  description = "Kubernetes API server URL or Slurm login host:port."
  value       = gpufleet_tenant_cluster.this.endpoint
}
