"""llmswap in front of real llama.cpp servers (llama-cpp-python) serving tiny GGUF models made per session.

Two models, `tiny` and `small` (tests/helpers/gguf_model.py), share llama-swap's default group: one runs at a
time, and a request for the other swaps. Their commands use `${PORT}`, as a user's config would.

Without llama-cpp-python (install it with .ci/install-llama-cpp.sh) these tests are skipped, unless
LLMSWAP_REQUIRE_E2E=1 (CI sets it): then a missing install fails them, so CI cannot pass by skipping.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.helpers.cli import LlmswapProcess, running_llmswap, write_config
from tests.helpers.demo import HOST, free_port_run
from tests.helpers.gguf_model import SIZES, llama_cpp_server_argv, tiny_llama

MODELS = ("tiny", "small")
# llama_cpp and what its server imports besides (the [server] extra).
SERVER_MODULES = ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context",
                  "pydantic_settings")
START_WITHIN = 60.0  # a cold llama_cpp.server imports FastAPI and loads the model: seconds on a busy machine


def missing_server_modules() -> list[str]:
    return [name for name in SERVER_MODULES if importlib.util.find_spec(name) is None]


@pytest.fixture(scope="session")
def llama_cpp_installed() -> None:
    """Skip (or, with LLMSWAP_REQUIRE_E2E=1, fail) when llama-cpp-python's server cannot run here."""
    missing = missing_server_modules()
    if not missing:
        return
    reason = (f"llama-cpp-python[server] is not installed (missing: {', '.join(missing)}); "
              "run .ci/install-llama-cpp.sh")
    if os.environ.get("LLMSWAP_REQUIRE_E2E") == "1":
        pytest.fail(f"LLMSWAP_REQUIRE_E2E=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def gguf_models(llama_cpp_installed: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Model id → its generated GGUF file, written once per test session."""
    folder = tmp_path_factory.mktemp("gguf")
    return {model_id: tiny_llama(SIZES[model_id], folder) for model_id in MODELS}


def llamacpp_entry(model_id: str, gguf: Path) -> dict[str, object]:
    return {
        "cmd": shlex.join(llama_cpp_server_argv(gguf, model_id, "${PORT}")),
        "proxy": f"http://{HOST}:${{PORT}}",
        "checkEndpoint": "/v1/models",  # llama_cpp.server has no /health
        "unloadTimeout": 5,
    }


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def llamacpp_llmswap(gguf_models: dict[str, Path],
                           tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LlmswapProcess]:
    folder = tmp_path_factory.mktemp("llamacpp")
    models = {model_id: llamacpp_entry(model_id, path) for model_id, path in gguf_models.items()}
    config = write_config(folder / "config.yaml", models, healthCheckTimeout=int(START_WITHIN),
                          startPort=free_port_run(len(models)))
    async with running_llmswap(config) as server:
        yield server


def llamacpp_upstreams(server: LlmswapProcess) -> dict[str, int]:
    """Model alias → PID of every live llama_cpp.server that this llmswap started."""
    return server.children_running("llama_cpp.server", "--model_alias")
