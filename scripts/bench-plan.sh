#!/usr/bin/env bash
# Benchmark: wall time of `terraform plan` on 200 gpufleet resources (gpufleet_tenant,
# count = 200, applied once) against 200 `terraform_data` resources, in one run against a
# freshly started backend. Each plan refreshes every resource (a gRPC read per tenant).
# Prints the median of REPS plans for each, and the ratio.
#   scripts/bench-plan.sh            # 200 resources, 5 plans each
#   COUNT=500 REPS=7 scripts/bench-plan.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$GPUFLEET_ROOT"
source scripts/backend.sh

COUNT="${COUNT:-200}"
REPS="${REPS:-5}"

scripts/bootstrap.sh >/dev/null
cargo build --workspace --bins
target_dir="${CARGO_TARGET_DIR:-$GPUFLEET_ROOT/target}/debug"

work="$(mktemp -d -t gpufleet-bench.XXXXXX)"
trap 'stop_backend; rm -rf "$work"' EXIT
start_backend "$target_dir/gpufleet-agent" "$work"
write_dev_overrides "$work/terraform.rc" "$target_dir"
export TF_CLI_CONFIG_FILE="$work/terraform.rc" TF_IN_AUTOMATION=1

mkdir -p "$work/gpufleet" "$work/builtin"
cat >"$work/gpufleet/main.tf" <<HCL
terraform {
  required_providers {
    gpufleet = {
      source = "gpufleet/gpufleet"
    }
  }
}
resource "gpufleet_tenant" "bench" {
  count        = $COUNT
  name         = "bench-\${count.index}"
  display_name = "Benchmark tenant \${count.index}"
  labels       = { bench = "plan" }
}
HCL
cat >"$work/builtin/main.tf" <<HCL
resource "terraform_data" "bench" {
  count = $COUNT
  input = { name = "bench-\${count.index}", display_name = "Benchmark tenant \${count.index}" }
}
HCL

for dir in gpufleet builtin; do
  echo "==> Applying $COUNT resources ($dir)"
  terraform -chdir="$work/$dir" apply -auto-approve -input=false -no-color >"$work/$dir.apply.log" \
    || { cat "$work/$dir.apply.log" >&2; exit 1; }
done

# Seconds (float) of one `terraform plan` in $1 that must find nothing to do.
time_plan() {
  local start end code
  start=$(date +%s.%N)
  set +e
  terraform -chdir="$1" plan -detailed-exitcode -input=false -no-color >"$1.plan.log" 2>&1
  code=$?
  set -e
  end=$(date +%s.%N)
  if [ "$code" -ne 0 ]; then
    echo "error: plan in $1 exited $code (expected 0: no changes)" >&2
    cat "$1.plan.log" >&2
    exit 1
  fi
  awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f\n", b - a }'
}

median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

declare -A times
for dir in gpufleet builtin; do
  echo "==> Timing $REPS plans ($dir)"
  samples=""
  for _ in $(seq "$REPS"); do
    samples+="$(time_plan "$work/$dir")"$'\n'
  done
  times[$dir]=$(printf '%s' "$samples" | median)
done

terraform_version=$(terraform version | head -1)
printf '\n%s, %s resources each, median of %s plans\n' "$terraform_version" "$COUNT" "$REPS"
printf '%-40s %10s\n' "configuration" "plan (s)"
printf '%-40s %10.2f\n' "$COUNT x gpufleet_tenant" "${times[gpufleet]}"
printf '%-40s %10.2f\n' "$COUNT x terraform_data" "${times[builtin]}"
printf '%-40s %10.2f\n' "ratio (gpufleet / terraform_data)" \
  "$(awk -v a="${times[gpufleet]}" -v b="${times[builtin]}" 'BEGIN { print a / b }')"
