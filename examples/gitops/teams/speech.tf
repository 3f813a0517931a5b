# Speech Recognition: one A100 node under Slurm, each GPU split by MIG into
# 3g.40gb + 2g.20gb + 2 x 1g.10gb.
module "speech" {
  source = "../../onboarding/modules/team"

  name         = "speech"
  display_name = "Speech Recognition"
  labels       = { cost_center = "cc-1002" }

  gpu_type = "A100-80GB"
  gpus     = 8

  orchestrator = "slurm"
  node_count   = 1
  storage_gib  = 200
  mig_layout = {
    "3g.40gb" = 1
    "2g.20gb" = 1
    "1g.10gb" = 2
  }
}

output "speech_tenant_id" {
  value = module.speech.tenant_id
}

output "speech_cluster_id" {
  value = module.speech.cluster_id
}
