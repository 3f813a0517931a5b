resource "gpufleet_tenant" "research" {
  name = "ml-research"
}

# 16 guaranteed H100 GPUs, plus up to 8 more from idle pool or on-demand capacity.
resource "gpufleet_gpu_quota" "example" {
  tenant     = gpufleet_tenant.research.id
  gpu_type   = "H100-80GB"
  gpus       = 16
  burst_gpus = 8
}
