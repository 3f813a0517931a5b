# Every GPU model the fleet has nodes of, with its pool and on-demand capacity and its
# MIG profiles.
data "gpufleet_gpu_types" "all" {}

output "gpu_models" {
  value = [for t in data.gpufleet_gpu_types.all.gpu_types : t.name]
}

# MIG profile names per MIG-capable model, e.g. "A100-80GB" => ["1g.10gb", ...].
output "mig_profiles" {
  value = {
    for t in data.gpufleet_gpu_types.all.gpu_types :
    t.name => [for p in t.mig_profiles : p.name] if t.mig_capable
  }
}
