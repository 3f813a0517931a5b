# What happened to a cluster: a driver change drains and returns its nodes one
# by one (max_unavailable at a time); a node that fails its install is
# quarantined and replaced.
data "gpufleet_events" "train" {
  object_id = gpufleet_tenant_cluster.train.id
}

output "train_history" {
  value = [
    for e in data.gpufleet_events.train.events :
    "${e.time} ${e.kind} ${e.node}: ${e.message}"
  ]
}
