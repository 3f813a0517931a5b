# Who changed what, and every refused call: the admin token reads all (or one
# tenant's), a tenant token its own.
data "gpufleet_audit_log" "team" {
  tenant = "ml-research"
}

output "refused" {
  value = [
    for e in data.gpufleet_audit_log.team.entries :
    "${e.time} ${e.token_name} ${e.method} ${e.object}: ${e.outcome}"
    if e.outcome != "OK"
  ]
}
