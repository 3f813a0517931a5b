#!/usr/bin/env bash
# The whole test suite (README command 2): installs what is missing, checks formatting and lints,
# builds both binaries, then runs every crate's tests, including the end-to-end suite
# that drives real Terraform against a real backend process.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$GPUFLEET_ROOT"

say() { printf '\n==> %s\n' "$*"; }

# The suite's node agents make /run/gpufleet/volumes and /run/gpufleet/homes mounts of their
# own (shared with their Slurm sandboxes, see gpufleet_slurm::sandbox::share_with_sandboxes)
# and keep them for the host's next agent. A GPU host keeps them until it reboots (/run);
# this machine does not: once the suite is over (passed or not) and nothing is mounted
# under them, they go.
host_mounts_down() {
  local m
  for m in /run/gpufleet/volumes /run/gpufleet/homes; do
    while mountpoint -q "$m" && ! grep -q " $m/" /proc/mounts; do
      umount "$m" || break
    done
    if grep -q " $m/" /proc/mounts; then
      echo "left mounted under $m (a test did not tear down):" >&2
      grep " $m/" /proc/mounts >&2
    fi
  done
}
trap host_mounts_down EXIT

say "bootstrap"
scripts/bootstrap.sh

say "cargo fmt --check"
cargo fmt --all -- --check

# Lints where the toolchain has clippy (the machine image does; nothing can fetch it).
if cargo clippy --version >/dev/null 2>&1; then
  say "cargo clippy --workspace --all-targets -D warnings"
  cargo clippy --workspace --all-targets -- -D warnings
else
  say "cargo clippy: not installed with this toolchain, lints skipped"
fi

say "cargo build --workspace --bins"
cargo build --workspace --bins
cargo build -p fake-nvml # the fake NVML library the nvml_fake tests load

target_dir="${CARGO_TARGET_DIR:-$GPUFLEET_ROOT/target}"
export GPUFLEET_AGENT_BIN="$target_dir/debug/gpufleet-agent"
export GPUFLEET_PROVIDER_BIN="$target_dir/debug/terraform-provider-gpufleet"
TERRAFORM_BIN="$(command -v terraform)"
export TERRAFORM_BIN

say "cargo test --workspace (agent: $GPUFLEET_AGENT_BIN, terraform: $TERRAFORM_BIN)"
cargo test --workspace --no-fail-fast
