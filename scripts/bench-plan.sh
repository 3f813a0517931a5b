#!/usr/bin/env bash
# Benchmark: wall time of `terraform plan` on 200 gpufleet resources (gpufleet_tenant,
# count = 200, applied once) against 200 `terraform_data` resources, in one run against a
# freshly started backend. Each plan refreshes every resource (a gRPC read per tenant).
# Prints the median of REPS plans for each, the ratio, and the provider's share of the
# gpufleet plans' CPU (Terraform's and the provider's together).
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
# The children's user + system seconds from the second line of bash's `times`.
cpu_seconds() { tail -1 | awk '{ gsub(/[ms]/, " "); print $1 * 60 + $2 + $3 * 60 + $4 }'; }
export -f cpu_seconds

# The provider through a wrapper that appends its CPU seconds (user + system) to
# provider.cpu when it exits: its share of each plan's CPU.
mkdir -p "$work/provider"
cat >"$work/provider/terraform-provider-gpufleet" <<WRAP
#!/usr/bin/env bash
"$target_dir/terraform-provider-gpufleet" "\$@"
code=\$?
# (times in a pipeline would run in a subshell, which has no children)
times > "$work/provider.times.\$\$"
cpu_seconds < "$work/provider.times.\$\$" >> "$work/provider.cpu"
exit \$code
WRAP
chmod +x "$work/provider/terraform-provider-gpufleet"
write_dev_overrides "$work/terraform.rc" "$work/provider"
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

# Seconds (float) of one `terraform plan` in $1 that must find nothing to do; its CPU
# seconds (Terraform and the provider it ran) are appended to $1.cpu.
time_plan() {
  local start end code
  start=$(date +%s.%N)
  set +e
  (
    terraform -chdir="$1" plan -detailed-exitcode -input=false -no-color >"$1.plan.log" 2>&1
    code=$?
    times >"$1.times"
    cpu_seconds <"$1.times" >>"$1.cpu"
    exit $code
  )
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
rm -f "$work/provider.cpu"
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
# The provider's CPU over the whole plan's (Terraform's and the provider's), the gpufleet
# plans only (the applies before them wrote nothing to provider.cpu: it was removed).
printf '%-40s %9.1f%%\n' "provider's share of a plan's CPU" "$(paste -d' ' \
  <(tail -n "$REPS" "$work/provider.cpu") "$work/gpufleet.cpu" \
  | awk '{ p += $1; t += $2 } END { print (t > 0 ? 100 * p / t : 0) }')"
