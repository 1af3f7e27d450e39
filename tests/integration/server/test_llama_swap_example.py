"""A llama-swap example config (tests/unit/config/data/llama-swap-example.yaml) served for real: its
selectors and profiles route. Every local model's command becomes a demo upstream (`--echo`, named after
the model) and the cloud peer a local demo, so nothing but the commands and one URL differ from the file."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from types import MappingProxyType
from typing import Any

import aiohttp
import pytest

from llmswap.config import Config, load_config
from tests.helpers.demo import DemoProcess, running_demo
from tests.helpers.models import demo_config
from tests.integration.server.conftest import ServeConfig, Served
from tests.unit.config.test_selectors_profiles import LLAMA_SWAP_ENV, LLAMA_SWAP_EXAMPLE

KEY = {"Authorization": "Bearer sk-hunter2"}  # the file's first apiKeys entry


@pytest.fixture
async def cloud() -> AsyncIterator[DemoProcess]:
    async with running_demo("cloud", ["--echo"]) as demo:
        yield demo


def on_demos(config: Config, cloud: DemoProcess) -> Config:
    models = {}
    for model_id, model in config.models.items():
        demo = demo_config(model_id, "--echo")
        models[model_id] = dataclasses.replace(
            model, cmd=demo.cmd, cmd_text=demo.cmd_text, cmd_stop=(), proxy=demo.proxy, port=demo.port,
            check_endpoint="/health", health_check_timeout=demo.health_check_timeout, unload_timeout=2.0)
    peers = dict(config.peers)
    peers["openrouter"] = dataclasses.replace(peers["openrouter"], proxy=cloud.url)
    return dataclasses.replace(config, models=MappingProxyType(models), peers=MappingProxyType(peers))


async def ask(http: aiohttp.ClientSession, served: Served, model: str) -> tuple[str, dict[str, Any]]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    async with http.post(served.at("/v1/chat/completions"), json=body, headers=KEY) as response:
        assert response.status == 200, await response.text()
        return response.headers["X-Demo-Model"], (await response.json())["echo"]["body"]


async def test_the_example_selectors_and_profiles_route(
    serve_config: ServeConfig, http: aiohttp.ClientSession, cloud: DemoProcess
) -> None:
    config = load_config(LLAMA_SWAP_EXAMPLE, environ=LLAMA_SWAP_ENV)
    served = await serve_config(on_demos(config, cloud))

    demo, body = await ask(http, served, "chat")  # pin -> the alias gpt-4o-mini -> gpt-oss-120b
    assert (demo, body["model"]) == ("gpt-oss-120b", "openai/gpt-oss-120B")  # the target's useModelName
    assert (await ask(http, served, "coding-model"))[0] == "qwen-model"  # warm, nothing warm: the first
    await ask(http, served, "gemma-model")  # the matrix runs gemma or qwen, never both
    assert (await ask(http, served, "coding-model"))[0] == "gemma-model"  # warm: the ready one
    assert (await ask(http, served, "overflow"))[0] == "gemma-model"

    async with http.put(served.at("/api/profiles/active"), json={"name": "cloud"}, headers=KEY) as response:
        assert response.status == 200
    demo, body = await ask(http, served, "coding-model")  # pinned to the cloud peer
    assert (demo, body["model"]) == ("cloud", "meta-llama/llama-3.1-8b-instruct")
    assert (await ask(http, served, "code"))[0] == "gemma-model"  # pinned to the selector, which picks

    async with http.get(served.at("/v1/models"), headers=KEY) as response:
        listed = {record["id"]: record for record in (await response.json())["data"]}
    assert listed["overflow"]["meta"]["llamaswap"] == {
        "tier": "shared", "type": "selector", "strategy": "spillover",
        "targets": ["gemma-model", "openrouter/z-ai/glm-4.7"], "spillover": 2,
    }
    assert listed["overflow"]["status"] == {"value": "loaded"}
    assert "pair" not in listed  # unlisted
    assert listed["code"]["meta"]["llamaswap"] == {"type": "profile"}
