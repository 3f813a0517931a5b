#!/usr/bin/env bash
# Read-only check of gpufleet's NVML backend on a real GPU host (issue 13): prints
# `gpufleet-agent hw-check --hardware nvml` beside what nvidia-smi reports, and states each
# comparison as "equal" or "DIFFERENT".
#
# Then its load part (issue 32): the agent's medium-level load tests on the real GPUs
# (`hw-check --level medium`: memory patterns, a 10 s GEMM burn, memory copy and host
# link), each figure printed beside PyTorch's on the same GPU in the same run where
# `python3 -c 'import torch'` works, as ratios (gpufleet / PyTorch; the goal is 0.9 or
# better), and how long each level took. Skip it with DEVICE_CHECK_LOAD=0.
#
# It never changes anything: no MIG mode, instance, clock, power limit, persistence or
# driver change; every nvidia-smi call here is a query (--query-gpu, -q,
# mig -lgip/-lgipp/-lgi/-lci); the load tests and PyTorch only allocate memory and run
# kernels.
# `nvidia-smi mig -lgi/-lci` and gpufleet's instance queries need root; run it as root
# to compare instances.
#
#   scripts/device-check.sh              # uses target/debug/gpufleet-agent (or $GPUFLEET_AGENT_BIN)
#   GPUFLEET_NVML_LIB=... scripts/device-check.sh   # another NVML library (e.g. the fake)
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
agent="${GPUFLEET_AGENT_BIN:-${CARGO_TARGET_DIR:-$root/target}/debug/gpufleet-agent}"
if [[ ! -x "$agent" ]]; then
  echo "device-check: $agent not found; build it first: cargo build -p gpufleet-agent" >&2
  exit 2
fi
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "device-check: nvidia-smi not found: this is not an NVIDIA host" >&2
  exit 2
fi

say() { printf '\n==> %s\n' "$*"; }
differences=0
compare() { # compare WHAT OURS THEIRS
  if [[ "$2" == "$3" ]]; then
    printf '  %-40s equal (%s)\n' "$1" "$2"
  else
    printf '  %-40s DIFFERENT: gpufleet %s, nvidia-smi %s\n' "$1" "$2" "$3"
    differences=$((differences + 1))
  fi
}

say "gpufleet-agent hw-check --hardware nvml"
hw="$("$agent" hw-check --hardware nvml 2>&1)"
hw_rc=$?
printf '%s\n' "$hw"
if [[ $hw_rc -ne 0 ]]; then
  echo "device-check: hw-check failed (exit $hw_rc)" >&2
fi

fields=index,uuid,name,memory.total,mig.mode.current,mig.mode.pending,persistence_mode,driver_version,temperature.gpu,power.draw,ecc.errors.uncorrected.volatile.total,retired_pages.pending
say "nvidia-smi --query-gpu=$fields"
smi="$(nvidia-smi --query-gpu="$fields" --format=csv,noheader,nounits)"
printf '%s\n' "$smi"

say "nvidia-smi -q -d ROW_REMAPPER,PAGE_RETIREMENT"
nvidia-smi -q -d ROW_REMAPPER,PAGE_RETIREMENT

mig_on=0
if grep -q ', Enabled, ' <<<"$smi"; then
  mig_on=1
  for list in -lgip -lgipp -lgi -lci; do
    say "nvidia-smi mig $list"
    nvidia-smi mig "$list"
  done
else
  say "MIG is off on every GPU: nvidia-smi mig -lgip/-lgipp/-lgi/-lci skipped"
fi

say "comparisons"
trim() { sed -e 's/^ *//' -e 's/ *$//' <<<"$1"; }
onoff() { case "$1" in Enabled) echo on ;; Disabled) echo off ;; *) echo "$1" ;; esac; }

compare "driver" "$(sed -n 's/^driver: //p' <<<"$hw")" "$(trim "$(cut -d, -f8 <<<"$smi" | head -1)")"
compare "GPU count" "$(sed -n 's/^gpus: *//p' <<<"$hw")" "$(wc -l <<<"$smi" | tr -d ' ')"

while IFS=, read -r idx uuid _name mem mig pending persist _drv _temp _power _ecc _retired; do
  idx="$(trim "$idx")"
  line="$(grep -E "^gpu $idx: " <<<"$hw" | head -1)"
  if [[ -z "$line" ]]; then
    compare "gpu $idx reported" "no" "yes"
    continue
  fi
  if [[ "$line" == *"cannot be read"* ]]; then
    compare "gpu $idx readable" "no (${line#*: })" "yes"
    continue
  fi
  # gpu N: MODEL UUID MEM MiB, MIG on|off[ (pending X: ...)][, persistence on|off]
  read -r _ _ _model h_uuid h_mem _ <<<"$line"
  h_mig="$(sed -n 's/.*, MIG \(on\|off\).*/\1/p' <<<"$line")"
  h_pending="$(sed -n 's/.*(pending \(on\|off\):.*/\1/p' <<<"$line")"
  h_pending="${h_pending:-$h_mig}"
  h_persist="$(sed -n 's/.*, persistence \(on\|off\).*/\1/p' <<<"$line")"
  compare "gpu $idx UUID" "$h_uuid" "$(trim "$uuid")"
  compare "gpu $idx memory MiB" "$h_mem" "$(trim "$mem")"
  compare "gpu $idx MIG mode" "$h_mig" "$(onoff "$(trim "$mig")")"
  compare "gpu $idx pending MIG mode" "$h_pending" "$(onoff "$(trim "$pending")")"
  compare "gpu $idx persistence mode" "${h_persist:-unknown}" "$(onoff "$(trim "$persist")")"
  if [[ $mig_on -eq 1 && "$(onoff "$(trim "$mig")")" == on ]]; then
    # Instances: gpufleet's "mig PROFILE@START" lines vs -lgi rows "|   N  MIG 3g.40gb   9   1   0:4 |".
    ours="$(awk -v g="gpu $idx:" '$0 ~ "^gpu " {on = index($0, g) == 1; next} on && /^  mig / {split($2, a, "@"); print a[1] "@" a[2]}' <<<"$hw" | sort | paste -sd' ' -)"
    theirs="$(nvidia-smi mig -lgi -i "$idx" 2>/dev/null | awk '/MIG [0-9]+g\./ {for (i = 1; i <= NF; i++) if ($i == "MIG") {name = $(i+1); split($(i+4), p, ":"); print name "@" p[1]}}' | sort | paste -sd' ' -)"
    compare "gpu $idx MIG instances" "${ours:-none}" "${theirs:-none}"
  fi
done <<<"$smi"

if [[ "${DEVICE_CHECK_LOAD:-1}" != 0 ]]; then
  say "load tests: gpufleet-agent hw-check --hardware nvml --level medium"
  t0=$(date +%s.%N)
  load="$("$agent" hw-check --hardware nvml --level medium 2>&1)"
  load_rc=$?
  t1=$(date +%s.%N)
  printf '%s\n' "$load"
  load_failed="$(grep -cE '^  FAIL ' <<<"$load")"
  quick_t0=$(date +%s.%N)
  "$agent" hw-check --hardware nvml --level quick >/dev/null 2>&1
  quick_t1=$(date +%s.%N)
  printf '\n  level durations: quick %.1f s, medium %.1f s (hw-check exit %d)\n' \
    "$(awk -v a="$quick_t0" -v b="$quick_t1" 'BEGIN {print b - a}')" \
    "$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')" "$load_rc"
  # The first GPU's (or slice's) figures: "  PASS    gpu_burn GPU-...: 712.3 TFLOP/s (threshold ...".
  figure() { grep -E "^  [A-Z_]+ +$1 " <<<"$load" | head -1 | sed -n "s/^[^:]*: \\([0-9.]*\\)\\( \\/ \\([0-9.]*\\)\\)\\{0,1\\} \\(TFLOP\\/s\\|GB\\/s\\).*/\\1 \\3/p"; }
  ours_burn="$(figure gpu_burn | cut -d' ' -f1)"
  ours_copy="$(figure hbm_bandwidth | cut -d' ' -f1)"
  ours_h2d="$(figure host_bandwidth | cut -d' ' -f1)"
  ours_d2h="$(figure host_bandwidth | cut -d' ' -f2)"
  if python3 -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    say "PyTorch on the same GPU (device 0), same run"
    torch_out="$(python3 - <<'PY'
import time, torch
dev = torch.device("cuda:0")
def timed(f, reps):
    f(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps): f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps
n = 8192
a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
print("torch gpu_burn %.1f" % (2 * n**3 / timed(lambda: a @ b, 50) / 1e12))
del a, b
size = 8 << 30
free = torch.cuda.mem_get_info(dev)[0]
size = min(size, int(free * 0.4))
src = torch.empty(size, dtype=torch.uint8, device=dev)
dst = torch.empty_like(src)
print("torch hbm_bandwidth %.1f" % (2 * size / timed(lambda: dst.copy_(src), 5) / 1e9))
del src, dst
hsize = 1 << 30
host = torch.empty(hsize, dtype=torch.uint8).pin_memory()
d = torch.empty(hsize, dtype=torch.uint8, device=dev)
print("torch h2d %.1f" % (hsize / timed(lambda: d.copy_(host, non_blocking=True), 5) / 1e9))
print("torch d2h %.1f" % (hsize / timed(lambda: host.copy_(d, non_blocking=True), 5) / 1e9))
PY
)"
    printf '%s\n' "$torch_out"
    theirs() { sed -n "s/^torch $1 //p" <<<"$torch_out"; }
    say "gpufleet / PyTorch (goal 0.9 or better)"
    ratio() { # ratio NAME OURS THEIRS UNIT
      if [[ -n "$2" && -n "$3" ]]; then
        printf '  %-28s gpufleet %9s %-8s PyTorch %9s  ratio %s\n' "$1" "$2" "$4" "$3" "$(awk -v a="$2" -v b="$3" 'BEGIN {printf "%.2f", a / b}')"
      else
        printf '  %-28s gpufleet %9s %-8s PyTorch %9s  ratio -\n' "$1" "${2:-none}" "$4" "${3:-none}"
      fi
    }
    ratio "bf16 GEMM (burn)" "$ours_burn" "$(theirs gpu_burn)" "TFLOP/s"
    ratio "device copy (read + write)" "$ours_copy" "$(theirs hbm_bandwidth)" "GB/s"
    ratio "pinned host->device" "$ours_h2d" "$(theirs h2d)" "GB/s"
    ratio "pinned device->host" "$ours_d2h" "$(theirs d2h)" "GB/s"
  else
    say "PyTorch is not importable here (or sees no GPU): gpufleet's figures alone"
    printf '  bf16 GEMM %s TFLOP/s, copy %s GB/s, host->device %s GB/s, device->host %s GB/s\n' \
      "${ours_burn:-none}" "${ours_copy:-none}" "${ours_h2d:-none}" "${ours_d2h:-none}"
  fi
fi

say "summary"
if [[ -z "${load_failed:-}" ]]; then
  echo "load tests skipped (DEVICE_CHECK_LOAD=0)"
fi
load_failed="${load_failed:-0}"
if [[ $differences -eq 0 && $hw_rc -eq 0 && $load_failed -eq 0 ]]; then
  echo "every comparison equal; no load check failed"
else
  echo "$differences comparison(s) DIFFERENT (hw-check exit $hw_rc); $load_failed load check(s) FAIL ('not run: ...' says why a test could not run)"
  exit 1
fi
