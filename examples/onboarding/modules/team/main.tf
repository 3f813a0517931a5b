# One team: its tenant, its GPU quota, an optional reservation and one cluster.
# Everything is created with the provider's (admin) token; the tenant's own
# token is an output to hand to the team.

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

resource "gpufleet_reservation" "this" {
  count = var.reservation_nodes > 0 ? 1 : 0

  tenant          = gpufleet_tenant.this.id
  gpu_type        = var.gpu_type
  node_count      = var.reservation_nodes
  start_time      = var.reservation_start
  end_time        = var.reservation_end
  allow_on_demand = var.allow_on_demand

  # The backend checks reservations against the quota: create it first,
  # destroy it last.
  depends_on = [gpufleet_gpu_quota.this]
}

resource "gpufleet_tenant_cluster" "this" {
  tenant         = gpufleet_tenant.this.id
  name           = coalesce(var.cluster_name, var.name)
  orchestrator   = var.orchestrator
  gpu_type       = var.gpu_type
  node_count     = var.node_count
  reservation_id = var.reservation_nodes > 0 ? gpufleet_reservation.this[0].id : null
  storage_gib    = var.storage_gib
  mig_layout     = var.mig_layout

  depends_on = [gpufleet_gpu_quota.this]
}
