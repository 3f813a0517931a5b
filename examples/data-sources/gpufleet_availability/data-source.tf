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

# When are 2 H100 nodes first free for 48 hours, from now on?
data "gpufleet_availability" "two_for_two_days" {
  gpu_type   = "H100-80GB"
  node_count = 2
  duration   = "48h"
}

# A reservation of that window fits (quota allowing):
#   start_time = data.gpufleet_availability.two_for_two_days.earliest_start
#   end_time   = timeadd(data.gpufleet_availability.two_for_two_days.earliest_start, "48h")
output "h100_two_nodes_for_two_days_from" {
  value = data.gpufleet_availability.two_for_two_days.earliest_start
}
