# By the tenant's name, or by its id (the `id` attribute, or the `id` column of
# `gpufleet-agent tenants`).
# The token cannot be recovered by import: it stays null in state afterwards.
terraform import gpufleet_tenant.example ml-research
