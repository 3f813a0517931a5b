variable "tenant_id" {
  description = "Id of the tenant whose usage to read (a gpufleet_tenant's id)."
  type        = string
}

data "gpufleet_quota_usage" "h100" {
  tenant   = var.tenant_id
  gpu_type = "H100-80GB"
}

# GPUs the tenant may still take: gpus + burst_gpus - (used + reserved).
output "h100_gpus_left" {
  value = data.gpufleet_quota_usage.h100.available
}
