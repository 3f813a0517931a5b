# The id is the quota's id (the `id` attribute, or the `id` field of the API's
# ListGpuQuotas answer); one tenant has at most one quota per GPU model.
terraform import gpufleet_gpu_quota.example <quota-id>
