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
  description = "GPU model of the team's quota, reservation and cluster, as the catalog names it (see the gpufleet_gpu_types data source), e.g. \"H100-80GB\"."
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

variable "reservation_nodes" {
  description = "Whole nodes to reserve for the team; 0 means no reservation and the cluster draws its nodes from the pool at create time."
  type        = number
  default     = 0
}

# A cluster draws nodes only from an ACTIVE reservation, and a Terraform
# configuration needs fixed times (timestamp() would change on every plan and
# replace the reservation each time). So the default window starts in the past,
# which the backend accepts and treats as "active from now on", and ends far
# ahead. Set both to plan a window ahead of time instead.
variable "reservation_start" {
  description = "Reservation start, RFC 3339. Changing it replaces the reservation (and the cluster drawing from it)."
  type        = string
  default     = "2026-01-01T00:00:00Z"
}

variable "reservation_end" {
  description = "Reservation end, RFC 3339; changes in place when capacity allows."
  type        = string
  default     = "2030-01-01T00:00:00Z"
}

variable "allow_on_demand" {
  description = "When the pool is short in the reservation window, take the rest from on-demand capacity instead of failing. Changes in place; turning it off is refused while the pool cannot take the on-demand nodes back."
  type        = bool
  default     = false
}

variable "cluster_name" {
  description = "Name of the team's cluster; null uses the tenant name."
  type        = string
  default     = null
}

variable "orchestrator" {
  description = "\"kubernetes\" or \"slurm\". Changing it replaces the cluster."
  type        = string
  default     = "kubernetes"
}

variable "node_count" {
  description = "Nodes in the team's cluster; scales in place. With a reservation, at most reservation_nodes."
  type        = number
  default     = 1
}

variable "storage_gib" {
  description = "Size of the cluster's dedicated volume in GiB; grows in place, cannot shrink."
  type        = number
  default     = 100
}

variable "mig_layout" {
  description = "Per-GPU MIG layout (profile name => count) applied to every GPU of the cluster, e.g. { \"3g.40gb\" = 1, \"2g.20gb\" = 1, \"1g.10gb\" = 2 } on A100-80GB; null means whole GPUs (the only choice on L40S, which has no MIG)."
  type        = map(number)
  default     = null
}
