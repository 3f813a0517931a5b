# Sourced by scripts/demo.sh and scripts/bench-plan.sh: starts gpufleet-agent serve on a free
# port with a fresh data dir under $1 and waits for its listening line (no sleeps).
# Sets AGENT_PID, GPUFLEET_ENDPOINT and GPUFLEET_TOKEN (the admin token); stop_backend
# stops it with SIGTERM.

start_backend() {
  local agent="$1" work="$2"
  local admin_token listening
  BACKEND_WORK="$work"
  admin_token="admin-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
  coproc AGENT {
    # The token in the environment: a command line is readable by every local user.
    # --stop-workloads: the data dir goes with the run, so its clusters' Slurm daemons and
    # jobs end with serve (a real deployment leaves them running through a restart).
    GPUFLEET_ADMIN_TOKEN="$admin_token" exec "$agent" serve --listen 127.0.0.1:0 \
      --data-dir "$work/data" --stop-workloads 2>"$work/agent.log"
  }
  AGENT_PID=$AGENT_PID
  # A copy of the coprocess's stdout: bash closes the coprocess's own fds in subshells.
  local out
  exec {out}<&"${AGENT[0]}"
  if ! read -r -t 60 listening <&"$out"; then
    echo "error: the backend did not start; its log:" >&2
    cat "$work/agent.log" >&2
    return 1
  fi
  # Keep draining its stdout so it never blocks on a full pipe.
  cat <&"$out" >/dev/null &
  echo "$listening"
  export GPUFLEET_ENDPOINT="${listening##* }" GPUFLEET_TOKEN="$admin_token"
}

stop_backend() {
  if [ -n "${AGENT_PID:-}" ] && kill -0 "$AGENT_PID" 2>/dev/null; then
    echo "==> Stopping the backend (pid $AGENT_PID)"
    kill -TERM "$AGENT_PID" 2>/dev/null || true
    wait "$AGENT_PID" 2>/dev/null || true
  fi
  forget_slurm_accounts "${BACKEND_WORK:-}"
}

# The backend's data dir goes with the demo, so the host keeps nothing of its Slurm
# clusters either: each cluster's account (its processes ended) and runtime directory.
forget_slurm_accounts() {
  local dir name
  [ -n "$1" ] || return 0
  for dir in "$1"/data/slurm/gf* "$1"/data/agents/*/slurm/gf*; do
    [ -d "$dir" ] || continue
    name="$(basename "$dir")"
    rm -rf "/run/gpufleet/$name"
    if getent passwd "$name" >/dev/null; then
      pkill -KILL -u "$name" 2>/dev/null || true
      userdel "$name" 2>/dev/null || true
      groupdel "$name" 2>/dev/null || true
    fi
  done
}

# A CLI configuration that installs gpufleet/gpufleet from the filesystem mirror $2 (a
# release's mirror/, scripts/release.sh) with `terraform init`, the rest from the registry.
write_mirror_config() {
  cat >"$1" <<RC
provider_installation {
  filesystem_mirror {
    path    = "$2"
    include = ["registry.terraform.io/gpufleet/gpufleet"]
  }
  direct {
    exclude = ["registry.terraform.io/gpufleet/gpufleet"]
  }
}
RC
}

# Writes a Terraform CLI config to $1 whose dev_overrides point gpufleet/gpufleet at $2.
write_dev_overrides() {
  cat >"$1" <<RC
provider_installation {
  dev_overrides {
    "gpufleet/gpufleet" = "$2"
  }
  direct {}
}
RC
}
