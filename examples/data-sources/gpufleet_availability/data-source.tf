# How many H100 nodes are free for the whole of a two-week window: the fewest
# nodes free at any instant of the window, from the pool and from on-demand capacity.
data "gpufleet_availability" "h100_january" {
  gpu_type   = "H100-80GB"
  start_time = "2027-01-04T00:00:00Z"
  end_time   = "2027-01-18T00:00:00Z"
}

output "h100_free_pool_nodes" {
  value = data.gpufleet_availability.h100_january.free_pool_nodes
}

output "h100_free_on_demand_nodes" {
  value = data.gpufleet_availability.h100_january.free_on_demand_nodes
}
