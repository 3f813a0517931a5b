# One team of the GitOps example: its tenant, its GPU quota and one cluster drawn
# from the free pool. Everything is created with the pipeline's (admin) token;
# the tenant's own token is an output to hand to the team.

resource "gpufleet_tenant" "this" {
  name         = var.name
  display_name = var.display_name
  labels       = var.labels
}

resource "gpufleet_gpu_quota" "this" {
  tenant     = gpufleet_tenant.this.id
  gpu_type   = var.gpu_type
  gpus       = var.gpus
  burst_gpus = var.burst_gpus
}

resource "gpufleet_tenant_cluster" "this" {
  tenant       = gpufleet_tenant.this.id
  name         = var.name
  orchestrator = var.orchestrator
  gpu_type     = var.gpu_type
  node_count   = var.node_count
  storage_gib  = var.storage_gib
  mig_layout   = var.mig_layout

  # The backend checks the cluster against the quota: create it first, destroy
  # it last.
  depends_on = [gpufleet_gpu_quota.this]
}
