#!/usr/bin/env bash
# Read-only check of gpufleet's NVML backend on a real GPU host (issue 13): prints
# `gpufleet-agent hw-check --hardware nvml` beside what nvidia-smi reports, and states each
# comparison as "equal" or "DIFFERENT".
#
# It never changes anything: no MIG mode, instance, clock, persistence or driver change;
# every nvidia-smi call here is a query (--query-gpu, -q, mig -lgip/-lgipp/-lgi/-lci).
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

say "summary"
if [[ $differences -eq 0 && $hw_rc -eq 0 ]]; then
  echo "every comparison equal"
else
  echo "$differences comparison(s) DIFFERENT (hw-check exit $hw_rc)"
  exit 1
fi
