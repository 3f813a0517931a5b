# The root module the pipeline runs in: this file, plus one <team>.tf per team.
# Add a team by adding a file; remove it (after its merge request is approved)
# by deleting the file.

terraform {
  required_version = ">= 1.5"

  required_providers {
    gpufleet = {
      source = "gpufleet/gpufleet"
    }
  }

  # State is local (terraform.tfstate here) unless a backend is configured. In
  # a real pipeline keep it in a remote backend with locking, e.g.:
  #
  # backend "s3" {
  #   bucket       = "platform-terraform-state"
  #   key          = "gpufleet/teams.tfstate"
  #   region       = "eu-west-1"
  #   use_lockfile = true
  # }
  #
  # See docs/guides/gitops.md.
}

# endpoint and token come from GPUFLEET_ENDPOINT and GPUFLEET_TOKEN (the admin
# token: tenants and quotas need it).
provider "gpufleet" {}
