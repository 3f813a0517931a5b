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

work="$(mktemp -d -t gpufleet-demo.XXXXXX)"
agent_pid=""
cleanup() {
  if [ -n "$agent_pid" ] && kill -0 "$agent_pid" 2>/dev/null; then
    echo "==> Stopping the backend (pid $agent_pid)"
    kill -TERM "$agent_pid" 2>/dev/null || true
    wait "$agent_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

step "Starting the backend (fresh data dir, free port, default simulated fleet)"
admin_token="admin-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
# The agent prints one line once it listens; read it from a coprocess's stdout.
coproc AGENT {
  exec "$agent" serve --listen 127.0.0.1:0 --data-dir "$work/data" \
    --admin-token "$admin_token" 2>"$work/agent.log"
}
agent_pid=$AGENT_PID
listening=""
if ! read -r -t 60 listening <&"${AGENT[0]}"; then
  echo "error: the backend did not start; its log:" >&2
  cat "$work/agent.log" >&2
  exit 1
fi
# Keep draining its stdout so it never blocks on a full pipe.
cat <&"${AGENT[0]}" >/dev/null &
echo "$listening"
endpoint="${listening##* }"
export GPUFLEET_ENDPOINT="$endpoint" GPUFLEET_TOKEN="$admin_token"

step "The fleet (gpufleet-agent fleet)"
"$agent" fleet

step "Onboarding two teams with Terraform (examples/onboarding)"
cp -r examples/onboarding "$work/onboarding"
rm -rf "$work/onboarding/.terraform" "$work/onboarding"/terraform.tfstate*
# dev_overrides: Terraform uses the provider just built instead of a registry.
cat >"$work/terraform.rc" <<RC
provider_installation {
  dev_overrides {
    "gpufleet/gpufleet" = "$target_dir"
  }
  direct {}
}
RC
export TF_CLI_CONFIG_FILE="$work/terraform.rc" TF_IN_AUTOMATION=1
tf() { terraform -chdir="$work/onboarding" "$@"; }
# No `terraform init`: dev_overrides need no provider installation (and Terraform before
# 1.15 fails init trying the registry for it); `get` installs the local modules.
tf get -no-color
tf apply -auto-approve -input=false -no-color

step "Outputs (terraform output)"
tf output -no-color

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
