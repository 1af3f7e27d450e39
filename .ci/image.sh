#!/usr/bin/env bash
# Builds the container image (Containerfile) the way these machines allow, and leaves it mounted for the
# contents test (tests/e2e/test_image.py), whose root it prints on its last line.
#
# No registry serves base images here and `podman run` cannot start containers (the kernel's cgroups are in
# hybrid mode), but `podman build --isolation chroot` works. So the base that llama.cpp's image would give
# is made here: Debian bookworm from debootstrap (with Python 3.11 and llama-server's runtime libraries)
# plus the llama-server that .ci/install-llama-server.sh built, imported with `podman import`. The rootfs is
# cached in ~/.cache/llmswap (delete it to make it again).
#
# Usage: .ci/image.sh    (as root; needs .venv and .venv/bin/llama-server)
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# python3.11-venv needs distutils and the wheels ensurepip installs, which debootstrap does not pull in.
PACKAGES=python3.11,python3.11-venv,python3-distutils,python3-lib2to3,python3-pip-whl,python3-setuptools-whl,libgomp1,ca-certificates
CACHE=${HOME:-/root}/.cache/llmswap
BASE_TAR="$CACHE/image-base-bookworm-$(echo "$PACKAGES" | sha256sum | cut -c1-12).tar"
mkdir -p "$CACHE"
started=$(date +%s)
if [ ! -f "$BASE_TAR" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  debootstrap --variant=minbase --include="$PACKAGES" bookworm "$work/rootfs" \
      >"$work/debootstrap.log" 2>&1 || { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
  tar -C "$work/rootfs" -cf "$BASE_TAR.partial" .
  mv "$BASE_TAR.partial" "$BASE_TAR"
fi
echo "image: base rootfs ready in $(( $(date +%s) - started )) s" >&2

# The base: that rootfs, and llama-server at /app/llama-server (where llama.cpp's images keep it).
staged=$(mktemp -d)
mkdir -p "$staged/app"
cp .venv/bin/llama-server "$staged/app/llama-server"
cp "$BASE_TAR" "$staged/base.tar"
tar -rf "$staged/base.tar" -C "$staged" app
podman import --change 'ENTRYPOINT ["/app/llama-server"]' "$staged/base.tar" localhost/llmswap-base:ci >/dev/null
rm -rf "$staged"
echo "image: base imported in $(( $(date +%s) - started )) s" >&2

make image ENGINE=podman ENGINE_ARGS="--isolation chroot -q" BASE_IMAGE=localhost/llmswap-base:ci \
    IMAGE=localhost/llmswap:ci >/dev/null
echo "image: llmswap image built in $(( $(date +%s) - started )) s;" \
     "$(podman image inspect localhost/llmswap:ci --format '{{.Size}}') bytes" >&2
podman image mount localhost/llmswap:ci
