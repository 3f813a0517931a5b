resource "gpufleet_tenant" "example" {
  name         = "ml-research" # DNS label; changing it replaces the tenant
  display_name = "ML Research"
  labels = {
    cost_center = "cc-4711"
    team        = "research"
  }
}

# The team's token stays out of state: hand the team one with
# `gpufleet-agent token create --tenant ml-research --scope write NAME` (or rotate
# "default"), or mint
# one for a run with the ephemeral gpufleet_tenant_token. With it they see and change
# only their own reservations and clusters. (The `token` attribute that kept it in
# state is deprecated: docs/guides/credentials.md.)
