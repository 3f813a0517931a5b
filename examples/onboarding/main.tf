# Onboards two teams onto a gpufleet backend: for each, a tenant, a GPU quota,
# an optional reservation and one cluster.
#
# Sized for the backend's default fleet (pool: 4 x 8 H100-80GB, 2 x 8 A100-80GB,
# 2 x 8 H200-141GB; on-demand: 4 x 8 H100-80GB):
# - vision: 16 guaranteed H100 GPUs + 8 burst, a reservation of 2 nodes from now
#   on, and a 2-node Kubernetes cluster on the reserved nodes;
# - speech: 8 A100 GPUs, a 1-node Slurm cluster from the pool whose GPUs are each
#   split by MIG into 3g.40gb + 2g.20gb + 2 x 1g.10gb.
#
# Run with the admin token in GPUFLEET_TOKEN (and GPUFLEET_ENDPOINT unless the
# backend listens on http://127.0.0.1:7700):
#   terraform init && terraform apply
# No state keeps a token or a kubeconfig. Hand each team a token of its own, printed
# once: gpufleet-agent token create --tenant vision --scope write vision-team
# (a cluster's kubeconfig or Slurm login: the ephemeral gpufleet_cluster_credentials).

terraform {
  required_providers {
    gpufleet = {
      source = "gpufleet/gpufleet"
    }
  }
}

# endpoint and token come from GPUFLEET_ENDPOINT and GPUFLEET_TOKEN.
provider "gpufleet" {}

module "vision" {
  source = "./modules/team"

  name         = "vision"
  display_name = "Computer Vision"
  labels       = { cost_center = "cc-1001" }

  gpu_type   = "H100-80GB"
  gpus       = 16
  burst_gpus = 8

  reservation_nodes = 2

  orchestrator = "kubernetes"
  node_count   = 2
  storage_gib  = 500
}

module "speech" {
  source = "./modules/team"

  name         = "speech"
  display_name = "Speech Recognition"
  labels       = { cost_center = "cc-1002" }

  gpu_type = "A100-80GB"
  gpus     = 8

  orchestrator = "slurm"
  node_count   = 1
  storage_gib  = 200
  mig_layout = {
    "3g.40gb" = 1
    "2g.20gb" = 1
    "1g.10gb" = 2
  }
}
