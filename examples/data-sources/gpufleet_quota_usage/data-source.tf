variable "tenant_id" {
  description = "Id of the tenant whose usage to read (a gpufleet_tenant's id)."
  type        = string
}

data "gpufleet_quota_usage" "h100" {
  tenant   = var.tenant_id
  gpu_type = "H100-80GB"
}

# GPUs the tenant can obtain now: the smaller of its quota left and the free pool.
output "h100_gpus_left" {
  value = data.gpufleet_quota_usage.h100.available
}
