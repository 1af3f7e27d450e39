#!/usr/bin/env bash
# Installs llama-cpp-python (the real llama.cpp upstream of tests/e2e/llamacpp and bench) into .venv.
#
# llama-cpp-python ships only a source distribution: pip compiles llama.cpp, ~5 minutes on 2 cores. The wheel
# it builds is kept in ~/.cache/llmswap/wheels/, outside the checkout, so every later run on the same machine
# reuses it, CI's fresh clones included; delete it to rebuild. GGML_NATIVE=OFF builds for a generic x86-64 CPU rather than this one's exact instruction set,
# so a cached wheel stays valid when CI lands on another machine; tools, examples, tests and the C++ server
# are not needed (llama_cpp.server is Python) and are skipped to shorten the build.
#
# Usage: .ci/install-llama-cpp.sh
#   PYTHON=path/to/python    install into another environment than .venv
#   LLAMA_CPP_WHEELS=dir     keep the built wheel somewhere other than ~/.cache/llmswap/wheels
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.3.36
PYTHON=${PYTHON:-.venv/bin/python}
CACHE=${LLAMA_CPP_WHEELS:-${HOME:-/root}/.cache/llmswap/wheels}
WHEEL_GLOB="llama_cpp_python-${VERSION}-*.whl"

if [ ! -x "$PYTHON" ]; then
    echo "install-llama-cpp: $PYTHON not found; create it first: make .venv/.installed-stamp" >&2
    exit 1
fi

mkdir -p "$CACHE"
wheel=$(find "$CACHE" -maxdepth 1 -name "$WHEEL_GLOB" | head -n 1)
if [ -z "$wheel" ]; then
    echo "install-llama-cpp: building llama-cpp-python ${VERSION} (compiles llama.cpp, about 5 minutes)"
    started=$(date +%s)
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
        "$PYTHON" -m pip wheel --quiet --no-deps --no-binary llama-cpp-python --no-cache-dir --wheel-dir "$CACHE" \
        "llama-cpp-python==${VERSION}"
    wheel=$(find "$CACHE" -maxdepth 1 -name "$WHEEL_GLOB" | head -n 1)
    if [ -z "$wheel" ]; then
        echo "install-llama-cpp: pip wheel finished but left no $WHEEL_GLOB in $CACHE" >&2
        exit 1
    fi
    echo "install-llama-cpp: built $wheel in $(( $(date +%s) - started )) s"
else
    echo "install-llama-cpp: using cached $wheel"
fi

# The [server] extra brings llama_cpp.server's own dependencies (uvicorn, fastapi, sse-starlette...).
"$PYTHON" -m pip install --quiet "${wheel}[server]"
"$PYTHON" -c "import llama_cpp, llama_cpp.server; print('install-llama-cpp: llama_cpp', llama_cpp.__version__)"
