resource "gpufleet_tenant" "research" {
  name = "ml-research"
}

resource "gpufleet_gpu_quota" "research_h100" {
  tenant   = gpufleet_tenant.research.id
  gpu_type = "H100-80GB"
  gpus     = 16
}

# Two whole H100 nodes (16 GPUs) for the first two weeks of January.
resource "gpufleet_reservation" "example" {
  tenant     = gpufleet_tenant.research.id
  gpu_type   = "H100-80GB"
  node_count = 2
  start_time = "2027-01-04T00:00:00Z"
  end_time   = "2027-01-18T00:00:00Z"

  # When the pool is short in that window, take the rest from on-demand capacity
  # instead of failing; pool_nodes and on_demand_nodes show the split. Changes in
  # place: turning it off moves the on-demand nodes back to the pool, and is
  # refused when the pool cannot take them for the rest of the window.
  allow_on_demand = true

  # The backend checks the reservation against the tenant's quota, so the quota
  # must exist first (and is destroyed only after the reservation).
  depends_on = [gpufleet_gpu_quota.research_h100]
}
