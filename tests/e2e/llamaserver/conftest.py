"""llmswap in front of llama.cpp's own llama-server, serving tiny GGUF models made per session.

Without llama-server (install it with .ci/install-llama-server.sh) these tests are skipped, unless
LLMSWAP_REQUIRE_E2E=1 (CI sets it): then a missing binary fails them, so CI cannot pass by skipping.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.demo import HOST
from tests.helpers.gguf_model import TinyLlama, tiny_llama
from tests.helpers.llama_server import llama_server_argv, llama_server_binary

CONTEXT = 4096  # per slot: room for the conversations of test_kvcache_llamaserver.py
# The "small" shape with a context long enough for a few thousand prompt tokens: its prompt processing takes
# seconds on 2 shared cores, which is what a restore saves.
CHAT = TinyLlama("chat", embedding=256, layers=4, feed_forward=704, heads=4, kv_heads=2, context=CONTEXT,
                 seed=11)
OTHER = TinyLlama("other", embedding=64, layers=2, feed_forward=192, heads=4, kv_heads=4, context=CONTEXT,
                  seed=12)
START_WITHIN = 60


@pytest.fixture(scope="session")
def llama_server() -> str:
    """The llama-server binary; skips (or, with LLMSWAP_REQUIRE_E2E=1, fails) when there is none."""
    binary = llama_server_binary()
    if binary is not None:
        return binary
    reason = "llama-server is not installed; run .ci/install-llama-server.sh"
    if os.environ.get("LLMSWAP_REQUIRE_E2E") == "1":
        pytest.fail(f"LLMSWAP_REQUIRE_E2E=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def ggufs(llama_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gguf-llamaserver")
    return {"chat": tiny_llama(CHAT, folder), "other": tiny_llama(OTHER, folder)}


def llamaserver_entry(binary: str, gguf: Path, *, kv: bool, slots: int = 1,
                      **settings: Any) -> dict[str, Any]:
    """A `models.<id>` entry serving `gguf` with llama-server on `${PORT}`, slots saved in `${KV_DIR}`."""
    return {
        "cmd": shlex.join(llama_server_argv(binary, gguf, context=CONTEXT, slots=slots)),
        "proxy": f"http://{HOST}:${{PORT}}",
        "kvCache": kv,
        "unloadTimeout": 5,
        **settings,
    }
