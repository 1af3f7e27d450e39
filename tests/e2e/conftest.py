"""One real `llmswap` process for the e2e tests of a module: the official SDKs talk to it over HTTP.

It serves two demo models side by side — `chat` and `embed` — behind an API key, so the SDKs' own ways of
sending the key (OpenAI: `Authorization: Bearer`, Anthropic: `x-api-key`) are exercised too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.helpers.cli import LlmswapProcess, demo_model, running_llmswap, together, write_config

API_KEY = "sk-e2e-0123456789abcdef"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def llmswap(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LlmswapProcess]:
    folder: Path = tmp_path_factory.mktemp("e2e")
    models = {"chat": demo_model("chat"), "embed": demo_model("embed")}
    config = write_config(folder / "config.yaml", models, routing=together("chat", "embed"),
                          apiKeys=[API_KEY])
    async with running_llmswap(config) as server:
        yield server
