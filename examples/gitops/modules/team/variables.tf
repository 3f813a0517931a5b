variable "name" {
  description = "Tenant name: a DNS label (lowercase letters, digits and '-', 1..63 characters). Changing it replaces the tenant and everything below it."
  type        = string
}

variable "display_name" {
  description = "Human-readable team name; null uses the tenant name."
  type        = string
  default     = null
}

variable "labels" {
  description = "Labels on the tenant, e.g. a cost center; null means none."
  type        = map(string)
  default     = null
}

variable "gpu_type" {
  description = "GPU model of the team's quota and cluster, as the catalog names it (see the gpufleet_gpu_types data source), e.g. \"H100-80GB\". A model the fleet has no nodes of is refused at plan time."
  type        = string
}

variable "gpus" {
  description = "Guaranteed GPUs of that model."
  type        = number
}

variable "burst_gpus" {
  description = "Extra GPUs the team may use from idle pool or on-demand capacity."
  type        = number
  default     = 0
}

variable "orchestrator" {
  description = "\"kubernetes\" or \"slurm\". Changing it replaces the cluster."
  type        = string
  default     = "kubernetes"
}

variable "node_count" {
  description = "Whole nodes in the team's cluster, from the free pool within the quota; scales in place."
  type        = number
  default     = 1
}

variable "storage_gib" {
  description = "Size of the cluster's dedicated volume in GiB; grows in place, cannot shrink."
  type        = number
  default     = 100
}

variable "mig_layout" {
  description = "Per-GPU MIG layout (profile name => count) for every GPU of the cluster; null means whole GPUs."
  type        = map(number)
  default     = null
}
