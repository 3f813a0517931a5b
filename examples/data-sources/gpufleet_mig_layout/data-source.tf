# Does this split of one H100 fit, and how? The planner answers without creating anything.
data "gpufleet_mig_layout" "inference" {
  gpu_type = "H100-80GB"
  layout = {
    "3g.40gb" = 1
    "2g.20gb" = 1
    "1g.10gb" = 2
  }
}

output "inference_layout_fits" {
  value = data.gpufleet_mig_layout.inference.fits
}

# Where each instance goes on the GPU (profile@start+memory slices), in creation order
# (larger profiles first): ["3g.40gb@4+4", "2g.20gb@0+2", "1g.10gb@2+1", "1g.10gb@3+1"].
output "inference_placements" {
  value = [
    for p in data.gpufleet_mig_layout.inference.placements :
    "${p.profile}@${p.start}+${p.size}"
  ]
}

# A layout that does not fit is an answer, not an error: warn with the rule and the
# nearest valid layouts.
check "inference_layout" {
  assert {
    condition     = data.gpufleet_mig_layout.inference.fits
    error_message = "MIG layout does not fit: ${data.gpufleet_mig_layout.inference.reason}; try ${join(" or ", data.gpufleet_mig_layout.inference.suggestions)}"
  }
}
