# Sourced by the project's scripts (and by hand: `source scripts/env.sh`).
# Puts the tools that scripts/bootstrap.sh installs on PATH for this shell only.
GPUFLEET_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export GPUFLEET_ROOT
case ":$PATH:" in
  *":$GPUFLEET_ROOT/.tools/bin:"*) ;;
  *) export PATH="$GPUFLEET_ROOT/.tools/bin:$PATH" ;;
esac
# Terraform must not phone home (no network here, and it slows every command).
export CHECKPOINT_DISABLE=1
