# The id is the cluster's id (the `id` attribute, or the `id` field of the API's
# ListTenantClusters answer), not its name.
terraform import gpufleet_tenant_cluster.example <cluster-id>
