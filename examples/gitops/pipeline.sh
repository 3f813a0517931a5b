#!/usr/bin/env bash
# The GitOps pipeline for a directory of gpufleet team definitions (a Terraform root
# module: versions.tf plus one <team>.tf per team).
#
#   pipeline.sh [--plan-only] [DIR]     DIR defaults to the teams/ directory beside this script
#
# Steps, in order; the first one that fails stops the pipeline with a non-zero exit and
# a line "pipeline: FAILED at <step>" on stderr:
#
#   fmt       terraform fmt -check -recursive -diff   (nothing is contacted)
#   init      terraform init                           (modules, providers, the state
#                                                      backend; see INIT_MODE)
#   validate  terraform validate
#   plan      terraform plan -detailed-exitcode -out=<plan file>
#   apply     terraform apply <plan file>              (skipped with --plan-only, or when
#                                                      the plan has no changes)
#
# On a pull request run it with --plan-only; on merge, without. The last line on stdout
# says how it ended: "pipeline: no changes", "pipeline: plan saved to FILE (not applied)"
# or "pipeline: applied".
#
# Environment:
#   GPUFLEET_TOKEN      required: the token the provider uses (the admin token for a
#                       platform workspace that creates tenants and quotas)
#   GPUFLEET_ENDPOINT   the gpufleet API (the provider's default: http://127.0.0.1:7700)
#   TERRAFORM           the terraform command (default: terraform on PATH)
#   PLAN_FILE           where the saved plan goes (default: DIR/tfplan)
#   TF_LOCK_TIMEOUT     how long to wait for the state lock (default: 5m)
#   TF_CLI_CONFIG_FILE  as Terraform reads it, e.g. dev_overrides for a locally built
#                       provider
#   INIT_MODE           init or get. Default: get when TF_CLI_CONFIG_FILE has
#                       dev_overrides, else init. With dev_overrides `terraform init`
#                       looks the provider of an existing state up in the registry and
#                       fails offline; `terraform get` installs the local modules only
#                       (so it suits local state, not a remote backend block).
set -euo pipefail

usage() {
  echo "usage: $0 [--plan-only] [DIR]" >&2
  exit 64
}

plan_only=0
dir=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --plan-only) plan_only=1 ;;
    -h | --help) usage ;;
    -*)
      echo "pipeline: unknown option $1" >&2
      usage
      ;;
    *)
      [[ -z "$dir" ]] || usage
      dir="$1"
      ;;
  esac
  shift
done

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="${dir:-$here/teams}"
if [[ ! -d "$dir" ]]; then
  echo "pipeline: FAILED at setup: $dir is not a directory" >&2
  exit 1
fi
dir="$(cd "$dir" && pwd)"

terraform="${TERRAFORM:-terraform}"
if ! command -v "$terraform" >/dev/null 2>&1; then
  echo "pipeline: FAILED at setup: '$terraform' not found (put terraform on PATH or set TERRAFORM)" >&2
  exit 1
fi
if [[ -z "${GPUFLEET_TOKEN:-}" ]]; then
  echo "pipeline: FAILED at setup: GPUFLEET_TOKEN is not set (the token the provider uses)" >&2
  exit 1
fi

plan_file="${PLAN_FILE:-$dir/tfplan}"
lock_timeout="${TF_LOCK_TIMEOUT:-5m}"

init_mode="${INIT_MODE:-}"
if [[ -z "$init_mode" ]]; then
  init_mode="init"
  if [[ -n "${TF_CLI_CONFIG_FILE:-}" && -f "$TF_CLI_CONFIG_FILE" ]] \
    && grep -q dev_overrides "$TF_CLI_CONFIG_FILE"; then
    init_mode="get"
  fi
fi
case "$init_mode" in
  init) init_cmd=("$terraform" init -input=false -no-color -lock-timeout="$lock_timeout") ;;
  get) init_cmd=("$terraform" get -no-color) ;;
  *)
    echo "pipeline: FAILED at setup: INIT_MODE must be init or get, not '$init_mode'" >&2
    exit 1
    ;;
esac

# Terraform in a pipeline: no prompts, no "run terraform apply next" hints, no version
# check against checkpoint.hashicorp.com.
export TF_IN_AUTOMATION=1 TF_INPUT=0 CHECKPOINT_DISABLE=1

say() { printf 'pipeline: %s\n' "$*"; }

fail() { # fail STEP CODE
  echo "pipeline: FAILED at $1 (exit $2); nothing after it ran" >&2
  exit "$2"
}

# step NAME COMMAND...: runs the command in DIR, stops the pipeline when it fails.
step() {
  local name="$1"
  shift
  say "step $name: $*"
  local code=0
  (cd "$dir" && "$@") || code=$?
  if [[ $code -ne 0 ]]; then
    fail "$name" "$code"
  fi
}

say "team definitions: $dir"
say "endpoint: ${GPUFLEET_ENDPOINT:-http://127.0.0.1:7700 (default)}"

step fmt "$terraform" fmt -check -recursive -diff -no-color
step init "${init_cmd[@]}"
step validate "$terraform" validate -no-color

# -detailed-exitcode: 0 = no changes, 1 = error, 2 = changes to apply.
say "step plan: $terraform plan -detailed-exitcode -out=$plan_file"
rm -f "$plan_file"
plan_code=0
(cd "$dir" && "$terraform" plan -input=false -no-color -detailed-exitcode \
  -lock-timeout="$lock_timeout" -out="$plan_file") || plan_code=$?
case "$plan_code" in
  0)
    rm -f "$plan_file"
    say "no changes"
    exit 0
    ;;
  2) ;;
  *)
    # Terraform saves an errored plan too (it refuses to apply one); remove it anyway.
    rm -f "$plan_file"
    fail plan "$plan_code"
    ;;
esac

if [[ $plan_only -eq 1 ]]; then
  say "plan saved to $plan_file (not applied)"
  exit 0
fi

# A saved plan is applied exactly as planned, without asking; if the state changed
# since the plan, Terraform refuses it as stale.
step apply "$terraform" apply -input=false -no-color -lock-timeout="$lock_timeout" "$plan_file"
rm -f "$plan_file"
say "applied"
