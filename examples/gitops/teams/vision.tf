# Computer Vision: two whole H100 nodes under Kubernetes, with room to burst.
module "vision" {
  source = "../../onboarding/modules/team"

  name         = "vision"
  display_name = "Computer Vision"
  labels       = { cost_center = "cc-1001" }

  gpu_type   = "H100-80GB"
  gpus       = 16
  burst_gpus = 8

  orchestrator = "kubernetes"
  node_count   = 2
  storage_gib  = 500
}

output "vision_tenant_id" {
  value = module.vision.tenant_id
}

output "vision_cluster_id" {
  value = module.vision.cluster_id
}
