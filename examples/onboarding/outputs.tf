output "vision_tenant_id" {
  value = module.vision.tenant_id
}

output "vision_cluster_endpoint" {
  value = module.vision.cluster_endpoint
}

output "vision_node_hostnames" {
  value = module.vision.node_hostnames
}

output "vision_storage_path" {
  value = module.vision.storage_path
}

output "speech_tenant_id" {
  value = module.speech.tenant_id
}

output "speech_cluster_endpoint" {
  value = module.speech.cluster_endpoint
}

output "speech_node_hostnames" {
  value = module.speech.node_hostnames
}

output "speech_storage_path" {
  value = module.speech.storage_path
}

output "speech_gpu_partitions" {
  value = module.speech.gpu_partitions
}
