resource "gpufleet_tenant" "research" {
  name = "ml-research"
}

resource "gpufleet_gpu_quota" "research_h100" {
  tenant     = gpufleet_tenant.research.id
  gpu_type   = "H100-80GB"
  gpus       = 16
  burst_gpus = 8
}

resource "gpufleet_gpu_quota" "research_a100" {
  tenant   = gpufleet_tenant.research.id
  gpu_type = "A100-80GB"
  gpus     = 8
}

# A cluster can draw nodes only from a reservation that is active now. A start
# time in the past is accepted and means "from now on".
resource "gpufleet_reservation" "training" {
  tenant     = gpufleet_tenant.research.id
  gpu_type   = "H100-80GB"
  node_count = 2
  start_time = "2026-01-01T00:00:00Z"
  end_time   = "2030-01-01T00:00:00Z"

  depends_on = [gpufleet_gpu_quota.research_h100]
}

# A Kubernetes cluster on the two reserved H100 nodes.
resource "gpufleet_tenant_cluster" "example" {
  tenant         = gpufleet_tenant.research.id
  name           = "training"
  orchestrator   = "kubernetes"
  gpu_type       = "H100-80GB"
  node_count     = 2 # scales in place
  reservation_id = gpufleet_reservation.training.id
  storage_gib    = 500 # grows in place, never shrinks

  # The newest offered driver that runs CUDA 12.4 is chosen, and shown, at plan
  # time; a change rolls through the nodes one at a time (max_unavailable).
  cuda_version = "12.4"
}

# A Slurm cluster on one A100 node from the pool, each GPU split by MIG into
# 3g.40gb + 2g.20gb + 2 x 1g.10gb (7 compute slices, 8 memory slices: a full GPU).
resource "gpufleet_tenant_cluster" "inference" {
  tenant       = gpufleet_tenant.research.id
  name         = "inference"
  orchestrator = "slurm"
  gpu_type     = "A100-80GB"
  node_count   = 1
  storage_gib  = 100
  mig_layout = {
    "3g.40gb" = 1
    "2g.20gb" = 1
    "1g.10gb" = 2
  }
  # Who may log in to its Slurm login (as the cluster's own account).
  ssh_public_keys = [file("~/.ssh/id_ed25519.pub")]

  depends_on = [gpufleet_gpu_quota.research_a100]
}

output "training_endpoint" {
  value = gpufleet_tenant_cluster.example.endpoint
}

# The driver on every node, e.g. "580.173.02".
output "training_driver" {
  value = gpufleet_tenant_cluster.example.driver_version
}

output "training_hostnames" {
  value = gpufleet_tenant_cluster.example.nodes[*].hostname
}

# Every GPU of the cluster by UUID, e.g. for an inventory or CUDA_VISIBLE_DEVICES.
output "training_gpu_uuids" {
  value = flatten(gpufleet_tenant_cluster.example.nodes[*].gpu_uuids)
}

# A kubeconfig for this cluster alone, for this run only (never in state), handed
# to a tool through a provisioner's environment.
ephemeral "gpufleet_cluster_credentials" "training" {
  cluster_id = gpufleet_tenant_cluster.example.id
}

resource "terraform_data" "kubeconfig" {
  triggers_replace = [gpufleet_tenant_cluster.example.id]
  provisioner "local-exec" {
    command     = "umask 077 && printf '%s' \"$KUBECONFIG_DATA\" > training.kubeconfig"
    environment = { KUBECONFIG_DATA = ephemeral.gpufleet_cluster_credentials.training.credentials }
  }
}
