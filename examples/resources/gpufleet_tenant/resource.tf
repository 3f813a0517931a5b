resource "gpufleet_tenant" "example" {
  name         = "ml-research" # DNS label; changing it replaces the tenant
  display_name = "ML Research"
  labels = {
    cost_center = "cc-4711"
    team        = "research"
  }
}

# The tenant's bearer token is issued at create and kept in state. To rotate
# it in place, give the tenant a new token_rotation (e.g. "2026-12"): the old
# token then works for token_overlap_seconds (default 3600) more.
# Hand it to the team (e.g. through a secret store): with it they see and change
# only their own reservations and clusters.
output "ml_research_token" {
  value     = gpufleet_tenant.example.token
  sensitive = true
}
