# A read-only token for the team's pull-request pipeline: it plans (every read
# and plan-time dry run), and its apply is refused naming the scope.
resource "gpufleet_tenant_token" "ci_plan" {
  tenant     = gpufleet_tenant.example.id
  name       = "ci-plan"
  scope      = "read"
  expires_at = "2027-06-30T00:00:00Z"

  # Give rotation a new value to rotate the secret in place; the old one keeps
  # working for rotation_overlap_seconds (default 3600).
  rotation                 = "2026-12"
  rotation_overlap_seconds = 600
}

# The secret is not kept in state (the `token` attribute is deprecated): the pipeline's
# holder takes it from `gpufleet-agent token rotate ci-plan --tenant ml-research`, or a
# run mints its own with the ephemeral gpufleet_tenant_token.
