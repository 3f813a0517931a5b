#!/usr/bin/env bash
# The main job on a fresh machine (README command 1):
#   install what is missing, build, start the backend with the default simulated fleet,
#   show the fleet, then onboard two teams with `terraform apply` on examples/onboarding,
#   print the outputs and show that a second plan has nothing to do.
# Everything lives in a temp dir that is removed at the end; the backend is stopped on exit.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$GPUFLEET_ROOT"

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

step "Installing what is missing (protoc, Terraform)"
scripts/bootstrap.sh

step "Building gpufleet-agent and terraform-provider-gpufleet (debug)"
cargo build --workspace --bins
target_dir="${CARGO_TARGET_DIR:-$GPUFLEET_ROOT/target}/debug"
agent="$target_dir/gpufleet-agent"

source scripts/backend.sh
work="$(mktemp -d -t gpufleet-demo.XXXXXX)"
trap 'stop_backend; rm -rf "$work"' EXIT

step "Starting the backend (fresh data dir, free port, default simulated fleet)"
start_backend "$agent" "$work"
endpoint="$GPUFLEET_ENDPOINT"

step "The fleet (gpufleet-agent fleet)"
"$agent" fleet

step "Onboarding two teams with Terraform (examples/onboarding)"
cp -r examples/onboarding "$work/onboarding"
rm -rf "$work/onboarding/.terraform" "$work/onboarding"/terraform.tfstate*
# The provider as an operator installs it: packaged by scripts/release.sh (from the
# binaries just built) and installed by `terraform init` from the release's mirror.
GPUFLEET_RELEASE_BINARIES="$target_dir" scripts/release.sh "$work/release" >/dev/null
write_mirror_config "$work/terraform.rc" "$work/release/mirror"
export TF_CLI_CONFIG_FILE="$work/terraform.rc" TF_IN_AUTOMATION=1
tf() { terraform -chdir="$work/onboarding" "$@"; }
tf init -input=false -no-color
tf apply -auto-approve -input=false -no-color

step "The speech team's GPUs, each cut into MIG slices (terraform output speech_gpu_partitions)"
tf output -no-color speech_gpu_partitions

step "The backend's nodes now (gpufleet-agent nodes)"
"$agent" nodes

step "A second plan has nothing to do (terraform plan -detailed-exitcode)"
set +e
tf plan -detailed-exitcode -input=false -no-color
plan_code=$?
set -e
if [ "$plan_code" -ne 0 ]; then
  echo "error: the second plan is not empty (exit $plan_code)" >&2
  exit 1
fi

step "Demo complete: backend at $endpoint stops now"
