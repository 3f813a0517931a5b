#!/usr/bin/env bash
# The project's benchmarks in one run, each beside a baseline measured in the same run,
# printed as one table and written to docs/benchmarks.md with the machine it ran on.
#
#   scripts/bench.sh            # everything (about 6-8 minutes on 2 cores once built)
#   QUICK=1 scripts/bench.sh    # smaller sizes and fewer repetitions (about 2-3 minutes)
#   OUT=/tmp/b.md scripts/bench.sh   # write the report elsewhere
#
# Rows: terraform plan of 10/100/1,000 gpufleet_tenant vs as many terraform_data; plan and
# apply of the onboarding example (tenants, quotas, a reservation, clusters, MIG) vs as
# many terraform_data; reservation admission at 10,000 existing holdings vs none, and
# calls during a 1,000-node cluster create vs idle (tests/benches/admission_scale.rs); a plan
# of 200 mixed resources vs the same plan with -refresh=false (tests/benches/refresh_cost.rs); the MIG planner vs exhaustive enumeration
# (backend-agent/gpu/benches/planner.rs); node-agent registration and reads at 1,000
# agents (backend-agent/benches/node_agents.rs); the bandwidth test
# (backend-agent/benches/bandwidth.rs, when present). Numbers only: nothing is asserted.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$GPUFLEET_ROOT"
source scripts/backend.sh

QUICK="${QUICK:-0}"
OUT="${OUT:-$GPUFLEET_ROOT/docs/benchmarks.md}"
if [ "$QUICK" = 1 ]; then
  SIZES=(10 100)
  REPS=1
  EXISTING=2000
  MEASURED=500
  CLUSTER_NODES=100
else
  SIZES=(10 100 1000)
  REPS=3
  EXISTING=10000
  MEASURED=2000
  CLUSTER_NODES=1000
fi

scripts/bootstrap.sh >/dev/null
began=$(date +%s)
echo "==> Building (release)"
cargo build --release --workspace --bins
target_dir="${CARGO_TARGET_DIR:-$GPUFLEET_ROOT/target}/release"
export GPUFLEET_AGENT_BIN="$target_dir/gpufleet-agent"
export GPUFLEET_PROVIDER_BIN="$target_dir/terraform-provider-gpufleet"

work="$(mktemp -d -t gpufleet-bench.XXXXXX)"
trap 'stop_backend; rm -rf "$work"' EXIT
rows="$work/rows.md"
details="$work/details.md"
: >"$rows"
: >"$details"

# row BENCHMARK MEASURE RESULT BASELINE RATIO
row() { printf '| %s | %s | %s | %s | %s |\n' "$@" >>"$rows"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }'; }
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# Seconds (float) that the command takes; its output goes to $work/last.log.
timed() {
  local start end
  start=$(date +%s.%N)
  "$@" >"$work/last.log" 2>&1 || { cat "$work/last.log" >&2; return 1; }
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f\n", b - a }'
}
# The value of key=value in the BENCH line of file $1 for key $2.
bench_value() { grep '^BENCH ' "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }
details_section() { { printf '\n### %s\n\n```text\n' "$1"; cat "$2"; printf '```\n'; } >>"$details"; }

# ---------------------------------------------------------------- Terraform
start_backend "$GPUFLEET_AGENT_BIN" "$work" >/dev/null
write_dev_overrides "$work/terraform.rc" "$target_dir"
export TF_CLI_CONFIG_FILE="$work/terraform.rc" TF_IN_AUTOMATION=1
tf() { terraform -chdir="$1" "$2" -input=false -no-color "${@:3}"; }
plan_time() { timed tf "$1" plan -detailed-exitcode; }
median_plan() {
  local samples=""
  for _ in $(seq "$REPS"); do samples+="$(plan_time "$1")"$'\n'; done
  printf '%s' "$samples" | median
}
provider_block='terraform {
  required_providers {
    gpufleet = {
      source = "gpufleet/gpufleet"
    }
  }
}'
builtin() { # DIR COUNT: COUNT terraform_data resources
  mkdir -p "$1"
  cat >"$1/main.tf" <<HCL
resource "terraform_data" "bench" {
  count = $2
  input = { name = "bench-\${count.index}", display_name = "Benchmark tenant \${count.index}" }
}
HCL
}

for n in "${SIZES[@]}"; do
  echo "==> terraform plan: $n gpufleet_tenant and $n terraform_data"
  mkdir -p "$work/tenants-$n"
  cat >"$work/tenants-$n/main.tf" <<HCL
$provider_block
resource "gpufleet_tenant" "bench" {
  count        = $n
  name         = "bench-$n-\${count.index}"
  display_name = "Benchmark tenant \${count.index}"
  labels       = { bench = "plan" }
}
HCL
  builtin "$work/data-$n" "$n"
  timed tf "$work/tenants-$n" apply -auto-approve >/dev/null
  timed tf "$work/data-$n" apply -auto-approve >/dev/null
  ours=$(median_plan "$work/tenants-$n")
  base=$(median_plan "$work/data-$n")
  row "terraform plan (refresh, no changes)" "$n gpufleet_tenant vs $n terraform_data, median of $REPS" \
    "${ours} s" "${base} s" "$(ratio "$ours" "$base")"
done

echo "==> plan and apply: the onboarding example (tenants, quotas, a reservation, clusters, MIG)"
cp -r examples/onboarding "$work/mixed"
rm -rf "$work/mixed/.terraform" "$work/mixed"/terraform.tfstate*
terraform -chdir="$work/mixed" get -no-color >/dev/null
mixed_plan_first=$(timed tf "$work/mixed" plan -out="$work/mixed.plan")
mixed_apply=$(timed tf "$work/mixed" apply "$work/mixed.plan")
mixed_plan=$(median_plan "$work/mixed")
mixed_count=$(terraform -chdir="$work/mixed" state list | wc -l)
builtin "$work/mixed-data" "$mixed_count"
base_plan_first=$(timed tf "$work/mixed-data" plan -out="$work/mixed-data.plan")
base_apply=$(timed tf "$work/mixed-data" apply "$work/mixed-data.plan")
base_plan=$(median_plan "$work/mixed-data")
row "mixed configuration: first plan" "examples/onboarding ($mixed_count resources) vs $mixed_count terraform_data" \
  "${mixed_plan_first} s" "${base_plan_first} s" "$(ratio "$mixed_plan_first" "$base_plan_first")"
row "mixed configuration: apply" "create all of it (2 clusters, one with MIG on 8 GPUs)" \
  "${mixed_apply} s" "${base_apply} s" "$(ratio "$mixed_apply" "$base_apply")"
row "mixed configuration: plan after apply" "refresh, no changes, median of $REPS" \
  "${mixed_plan} s" "${base_plan} s" "$(ratio "$mixed_plan" "$base_plan")"
stop_backend >/dev/null
unset AGENT_PID

# ---------------------------------------------------------------- refresh cost
echo "==> refresh cost: plan of 200 mixed resources vs -refresh=false (tests/benches/refresh_cost.rs)"
ROUNDS=$((REPS + 2)) cargo bench -p gpufleet-e2e --bench refresh_cost >"$work/refresh.log" 2>"$work/refresh.err" \
  || { cat "$work/refresh.err" >&2; exit 1; }
f="$work/refresh.log"
row "plan refresh cost" "$(bench_value "$f" resources) mixed resources (tenants, quotas, clusters, reservations), plan vs plan -refresh=false, median of $(bench_value "$f" rounds) alternating rounds" \
  "$(bench_value "$f" refresh_s) s" "$(bench_value "$f" baseline_s) s" "$(ratio "$(bench_value "$f" refresh_s)" "$(bench_value "$f" baseline_s)")"
grep -v '^BENCH ' "$f" >"$work/refresh.table"
details_section "Plan refresh cost (tests/benches/refresh_cost.rs)" "$work/refresh.table"

# ---------------------------------------------------------------- admission
echo "==> reservation admission: $EXISTING existing holdings vs none (tests/benches/admission_scale.rs)"
EXISTING=$EXISTING MEASURED=$MEASURED CLUSTER_NODES=$CLUSTER_NODES cargo bench -p gpufleet-e2e --bench admission_scale >"$work/admission.log" 2>"$work/admission.err" \
  || { cat "$work/admission.err" >&2; exit 1; }
a="$work/admission.log"
existing=$(bench_value "$a" existing)
rounds=$(bench_value "$a" rounds)
row "reservation creates, 8 clients" "1-node reservations in random windows, 1,000 H100 pool nodes; $existing existing vs none (two backends, median of $rounds alternating rounds)" \
  "$(bench_value "$a" creates_per_s_full)/s" "$(bench_value "$a" creates_per_s_empty)/s" \
  "$(ratio "$(bench_value "$a" creates_per_s_full)" "$(bench_value "$a" creates_per_s_empty)")"
row "reservation create p99, 8 clients" "the same creates (median of the rounds' p99)" \
  "$(bench_value "$a" p99_ms_full) ms" "$(bench_value "$a" p99_ms_empty) ms" \
  "$(ratio "$(bench_value "$a" p99_ms_full)" "$(bench_value "$a" p99_ms_empty)")"
row "availability query p50" "a random 48 h window; $existing existing vs none" \
  "$(bench_value "$a" avail_p50_ms_full) ms" "$(bench_value "$a" avail_p50_ms_empty) ms" \
  "$(ratio "$(bench_value "$a" avail_p50_ms_full)" "$(bench_value "$a" avail_p50_ms_empty)")"
cluster_nodes=$(bench_value "$a" nodes)
if [ -n "$cluster_nodes" ]; then
  during="one $cluster_nodes-node cluster create ($(bench_value "$a" create_s) s) vs idle"
  row "read p99 during a large cluster create" "availability queries, one at a time, during $during" \
    "$(bench_value "$a" read_p99_ms_during) ms" "$(bench_value "$a" read_p99_ms_idle) ms" \
    "$(ratio "$(bench_value "$a" read_p99_ms_during)" "$(bench_value "$a" read_p99_ms_idle)")"
  row "reservation create p99 during a large cluster create" "creates, one at a time, during $during" \
    "$(bench_value "$a" write_p99_ms_during) ms" "$(bench_value "$a" write_p99_ms_idle) ms" \
    "$(ratio "$(bench_value "$a" write_p99_ms_during)" "$(bench_value "$a" write_p99_ms_idle)")"
fi
grep -v '^BENCH ' "$a" >"$work/admission.table"
details_section "Reservation admission (tests/benches/admission_scale.rs)" "$work/admission.table"

# ---------------------------------------------------------------- replay
replay_rows=$([ "$QUICK" = 1 ] && echo 20000 || echo 100000)
echo "==> replay: $replay_rows synthetic rows vs 10,000 (tests/benches/replay.rs)"
ROWS=$replay_rows cargo bench -p gpufleet-e2e --bench replay >"$work/replay.log" 2>"$work/replay.err" \
  || { cat "$work/replay.err" >&2; exit 1; }
r="$work/replay.log"
row "replay (gpufleet-agent replay)" "$(bench_value "$r" rows) synthetic trace rows, pooled and fixed partitions, vs $(bench_value "$r" baseline_rows) rows" \
  "$(bench_value "$r" rows_per_s) rows/s ($(bench_value "$r" wall_s) s)" "$(bench_value "$r" baseline_rows_per_s) rows/s" \
  "$(ratio "$(bench_value "$r" rows_per_s)" "$(bench_value "$r" baseline_rows_per_s)")"
grep -v '^BENCH ' "$r" >"$work/replay.table"
details_section "What pooling buys: replay (tests/benches/replay.rs)" "$work/replay.table"

# ---------------------------------------------------------------- MIG planner
echo "==> MIG planner (cargo bench -p gpufleet-gpu --bench planner)"
cargo bench -p gpufleet-gpu --bench planner >"$work/planner.log" 2>"$work/planner.err" || { cat "$work/planner.err" >&2; exit 1; }
# The ALL line: requests feasible placed placed% falseA falseR | accept m/p50/p99 | reject | all
read -r _ requests feasible placed placed_pct false_a false_r _ _ a50 _ _ _ r50 _ _ _ p50 p99 \
  < <(grep '^ALL ' "$work/planner.log") || true
row "MIG planner: placed" "$requests seeded random layout requests over every MIG model" \
  "$placed of $feasible feasible ($placed_pct), $false_a false accepts, $false_r false rejects" \
  "exhaustive enumeration: $feasible feasible" "$placed_pct"
row "MIG planner: time per request" "accept p50 / refuse with suggestions p50 / all p99" \
  "${a50} / ${r50} / ${p99} us" "-" "-"
details_section "MIG planner (backend-agent/gpu/benches/planner.rs)" "$work/planner.log"

# ---------------------------------------------------------------- node agents
echo "==> node agents at 1,000 (cargo bench -p gpufleet-agent --bench node_agents)"
cargo bench -p gpufleet-agent --bench node_agents >"$work/agents.log" 2>"$work/agents.err" \
  || { cat "$work/agents.err" >&2; exit 1; }
# The result column of the node_agents row whose name starts with $1.
result_of() { grep -F "| $1" "$work/agents.log" | head -1 | awk -F' [|] ' '{ print $3 }' | sed 's/ |$//'; }
row "node-agent registration" "1,000 embedded 8-GPU agents, each its own gRPC stream, until all ready" \
  "$(result_of 'registration to ready, 1,000 agents')" "-" "-"
row "read latency with 1,000 agents" "GetTenantCluster over loopback, TCP_NODELAY vs Nagle left on" \
  "$(result_of 'read latency, idle |')" "$(result_of 'read latency, idle, server sockets') (Nagle on)" "-"
row "heartbeats over real streams" "1,000 agents every 50 ms for 5 s" \
  "$(result_of 'heartbeats: real streams')" "$(result_of 'heartbeats: `Registry::heartbeat`') (registry alone)" "-"
details_section "Node agents (backend-agent/benches/node_agents.rs)" "$work/agents.log"

# ---------------------------------------------------------------- bandwidth test
if [ -f backend-agent/benches/bandwidth.rs ]; then
  echo "==> bandwidth test (cargo bench -p gpufleet-agent --bench bandwidth)"
  cargo bench -p gpufleet-agent --bench bandwidth >"$work/bandwidth.log" 2>"$work/bandwidth.err" \
    || { cat "$work/bandwidth.err" >&2; exit 1; }
  if grep -q '^BENCH ' "$work/bandwidth.log"; then
    b="$work/bandwidth.log"
    row "bandwidth test" "$(bench_value "$b" what | tr '_' ' ')" "$(bench_value "$b" result | tr '_' ' ')" \
      "$(bench_value "$b" baseline | tr '_' ' ')" "$(bench_value "$b" ratio)"
  else
    # Its table: | gpufleet bandwidth test | Gbit/s | % | and | plain socket copy | Gbit/s | % |
    col() { grep -F "| $1 |" "$work/bandwidth.log" | head -1 | awk -F'|' "{ gsub(/ /, \"\", \$$2); print \$$2 }"; }
    row "bandwidth test" "loopback, gpufleet's test vs a plain socket copy (backend-agent/benches/bandwidth.rs)" \
      "$(col 'gpufleet bandwidth test' 3) Gbit/s" "$(col 'plain socket copy' 3) Gbit/s" "$(col 'gpufleet bandwidth test' 4)"
  fi
  details_section "Bandwidth test (backend-agent/benches/bandwidth.rs)" "$work/bandwidth.log"
else
  row "bandwidth test" "backend-agent/benches/bandwidth.rs is not in this checkout: not run" "-" "-" "-"
fi

# ---------------------------------------------------------------- report
took=$(($(date +%s) - began))
cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || true)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain 2>/dev/null | grep -q . && echo " + uncommitted changes" || true)
{
  echo "# Benchmarks"
  echo
  echo "Written by \`scripts/bench.sh\`$( [ "$QUICK" = 1 ] && echo ' (QUICK=1: smaller sizes)'). Every row's baseline was measured in the same run on the same machine."
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- machine: $(nproc) CPUs, ${cpu:-unknown CPU}, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) memory"
  echo "- build: release, commit $commit$dirty; $(terraform version | head -1); whole run ${took} s"
  echo
  echo "| benchmark | what | result | baseline (same run) | ratio |"
  echo "|---|---|---|---|---|"
  cat "$rows"
  echo
  echo "## Each benchmark's own output"
  cat "$details"
} >"$work/report.md"
mkdir -p "$(dirname "$OUT")"
cp "$work/report.md" "$OUT"
echo
cat "$work/report.md" | sed -n '/^| benchmark/,/^$/p'
echo "(written to $OUT)"
