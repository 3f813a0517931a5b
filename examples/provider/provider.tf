terraform {
  required_providers {
    gpufleet = {
      source = "gpufleet/gpufleet"
    }
  }
}

# Every argument is optional:
# - endpoint falls back to GPUFLEET_ENDPOINT, then to http://127.0.0.1:7700;
# - token falls back to GPUFLEET_TOKEN.
# Prefer the environment variables for the token so it never lands in a file.
provider "gpufleet" {
  endpoint = var.gpufleet_endpoint
  token    = var.gpufleet_token

  # Required for an https:// endpoint: the PEM of the CA that signed its certificate.
  # ca_cert_pem = file("${path.module}/gpufleet-ca.pem")
}

variable "gpufleet_endpoint" {
  description = "gpufleet API address; null uses GPUFLEET_ENDPOINT or http://127.0.0.1:7700."
  type        = string
  default     = null
}

variable "gpufleet_token" {
  description = "Admin or tenant bearer token; null uses GPUFLEET_TOKEN."
  type        = string
  default     = null
  sensitive   = true
}
