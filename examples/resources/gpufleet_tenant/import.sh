# The id is the tenant's id as the backend reports it (the `id` attribute, or the
# `id` field of the API's ListTenants answer), not its name.
# The token cannot be recovered by import: it stays null in state afterwards.
terraform import gpufleet_tenant.example <tenant-id>
