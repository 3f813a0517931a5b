#!/usr/bin/env bash
# Packages a release of gpufleet for this platform (linux_amd64 on an x86_64 host):
#
#   OUT/terraform-provider-gpufleet_VERSION_linux_amd64.zip   the provider, as registries ship it
#   OUT/terraform-provider-gpufleet_VERSION_SHA256SUMS(.sig with a signing key)
#   OUT/mirror/registry.terraform.io/gpufleet/gpufleet/...    a provider mirror, both layouts:
#       terraform-provider-gpufleet_VERSION_linux_amd64.zip    (filesystem_mirror, packed)
#       index.json, VERSION.json                                (network_mirror: any static web server)
#   OUT/gpufleet-agent_VERSION_linux_amd64.tar.gz              the control plane and node agent binary,
#                                                               its systemd units and environment files
#
# `terraform init` installs the provider from the mirror with a CLI configuration such as
#
#   provider_installation {
#     filesystem_mirror {
#       path    = "OUT/mirror"
#       include = ["registry.terraform.io/gpufleet/gpufleet"]
#     }
#     direct { exclude = ["registry.terraform.io/gpufleet/gpufleet"] }
#   }
#
# (docs/guides/getting-started.md; tests/tests/release.rs runs exactly that).
#
# Usage: scripts/release.sh [OUT]          (default OUT: target/release-packages)
#   GPUFLEET_RELEASE_BINARIES=DIR  package the binaries already in DIR instead of building
#                                  them with `cargo build --release` (the tests use target/debug)
#   GPUFLEET_RELEASE_SIGNING_KEY=ID  sign the provider's SHA256SUMS with this gpg key
#                                  (SHA256SUMS.sig, as a registry wants it); unsigned without
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/target/release-packages}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

case "$(uname -s)/$(uname -m)" in
  Linux/x86_64) platform=linux_amd64 ;;
  Linux/aarch64) platform=linux_arm64 ;;
  *) echo "release: no Terraform platform name for $(uname -s)/$(uname -m)" >&2; exit 1 ;;
esac

version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$root/Cargo.toml")"
if [[ -z "$version" ]]; then
  echo "release: no version in [workspace.package] of Cargo.toml" >&2
  exit 1
fi

bin="${GPUFLEET_RELEASE_BINARIES:-}"
if [[ -z "$bin" ]]; then
  # shellcheck source=scripts/env.sh
  source "$root/scripts/env.sh"
  (cd "$root" && cargo build --release --bin gpufleet-agent --bin terraform-provider-gpufleet)
  bin="$root/target/release"
fi
for b in gpufleet-agent terraform-provider-gpufleet; do
  if [[ ! -x "$bin/$b" ]]; then
    echo "release: $bin/$b is missing or not executable" >&2
    exit 1
  fi
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The provider's zip: one executable named terraform-provider-gpufleet_vVERSION, as
# Terraform expects (any name starting with terraform-provider-gpufleet is found).
zip_name="terraform-provider-gpufleet_${version}_${platform}.zip"
cp "$bin/terraform-provider-gpufleet" "$work/terraform-provider-gpufleet_v${version}"
python3 - "$work/terraform-provider-gpufleet_v${version}" "$out/$zip_name" <<'EOF'
import os, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
info = zipfile.ZipInfo(os.path.basename(src), date_time=(2020, 1, 1, 0, 0, 0))
info.external_attr = 0o755 << 16  # executable once unpacked
info.compress_type = zipfile.ZIP_DEFLATED
with open(src, "rb") as f, zipfile.ZipFile(dst, "w") as z:
    z.writestr(info, f.read())
EOF
zip_sha="$(sha256sum "$out/$zip_name" | cut -d' ' -f1)"
echo "$zip_sha  $zip_name" > "$out/terraform-provider-gpufleet_${version}_SHA256SUMS"
# Signed where a key is configured (a registry checks this signature against the key it
# holds for the namespace): a detached binary signature, SHA256SUMS.sig.
if [[ -n "${GPUFLEET_RELEASE_SIGNING_KEY:-}" ]]; then
  gpg --batch --yes --local-user "$GPUFLEET_RELEASE_SIGNING_KEY" --detach-sign \
    --output "$out/terraform-provider-gpufleet_${version}_SHA256SUMS.sig" \
    "$out/terraform-provider-gpufleet_${version}_SHA256SUMS"
fi

# The mirror: the packed filesystem layout and the network mirror protocol's JSON in one
# tree, so it can be used as a directory or served as is.
mirror="$out/mirror/registry.terraform.io/gpufleet/gpufleet"
mkdir -p "$mirror"
cp "$out/$zip_name" "$mirror/$zip_name"
printf '{"versions":{"%s":{}}}\n' "$version" > "$mirror/index.json"
printf '{"archives":{"%s":{"url":"%s","hashes":["zh:%s"]}}}\n' \
  "$platform" "$zip_name" "$zip_sha" > "$mirror/$version.json"

# The agent: binary, service units, environment files (0600 once copied into place).
agent_dir="$work/gpufleet-agent_${version}_${platform}"
mkdir -p "$agent_dir/bin" "$agent_dir/systemd"
cp "$bin/gpufleet-agent" "$agent_dir/bin/"
cp "$root/packaging/systemd/"*.service "$agent_dir/systemd/"
cp "$root/packaging/"*.env.example "$agent_dir/"
cat > "$agent_dir/INSTALL" <<EOF
gpufleet-agent $version ($platform)

  install -m 0755 bin/gpufleet-agent /usr/local/bin/
  install -m 0644 systemd/gpufleet-serve.service systemd/gpufleet-node.service /etc/systemd/system/
  install -d -m 0700 /etc/gpufleet
  install -m 0600 serve.env.example /etc/gpufleet/serve.env   # on the control plane's host
  install -m 0600 node.env.example /etc/gpufleet/node.env     # on each GPU host
  systemctl daemon-reload && systemctl enable --now gpufleet-serve   # or gpufleet-node

docs/operations.md ("Running as a service", "Upgrades and version skew") says what each
setting does and in which order to upgrade.
EOF
tar -C "$work" -czf "$out/gpufleet-agent_${version}_${platform}.tar.gz" "gpufleet-agent_${version}_${platform}"
sha256sum "$out/gpufleet-agent_${version}_${platform}.tar.gz" | sed "s|  $out/|  |" \
  > "$out/gpufleet-agent_${version}_SHA256SUMS"

echo "release: $out/$zip_name"
echo "release: $out/mirror (filesystem_mirror path, or serve it as a network_mirror)"
echo "release: $out/gpufleet-agent_${version}_${platform}.tar.gz"
