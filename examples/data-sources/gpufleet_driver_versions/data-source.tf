# Every driver the platform offers, newest first.
data "gpufleet_driver_versions" "all" {}

# The drivers that run CUDA 12.4 on H100 nodes.
data "gpufleet_driver_versions" "h100_cuda124" {
  gpu_type     = "H100-80GB"
  cuda_version = "12.4"
}

# The driver a cluster with cuda_version = "12.4" (and no driver_version) gets.
output "h100_cuda124_driver" {
  value = data.gpufleet_driver_versions.h100_cuda124.latest
}

# Offered versions with their branch and end of life, e.g.
# "550.163.01" => "R550 (CUDA 12.4, end of life: ended)".
output "offered_drivers" {
  value = {
    for d in data.gpufleet_driver_versions.all.drivers :
    d.version => "${d.branch} (CUDA ${d.cuda_version}, end of life: ${d.end_of_life})"
  }
}
