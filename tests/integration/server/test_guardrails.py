"""Guardrails over real demo upstreams: a prompt over its model's context is refused before any load."""

from __future__ import annotations

import aiohttp

from llmswap.config.model import Capabilities
from llmswap.process.state import ProcessState
from tests.helpers.models import demo_config, exclusive_config
from tests.integration.server.conftest import ServeConfig


def chat(model: str, text: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 2}


async def test_a_prompt_over_the_declared_context_is_400_naming_both_numbers_with_no_swap(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    small = demo_config("small", capabilities=Capabilities(context=100))
    served = await serve_config(exclusive_config(small))
    async with http.post(served.at("/v1/chat/completions"), json=chat("small", "x" * 2000)) as response:
        assert response.status == 400
        error = (await response.json())["error"]
        assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
        assert "at least 250 tokens" in error["message"]
        assert "100-token context of model small" in error["message"]
    assert served.router.processes["small"].state is ProcessState.STOPPED
    assert sum(served.router.stats.swaps_by_rule.values()) == 0

    async with http.post(served.at("/v1/chat/completions"), json=chat("small", "hello")) as response:
        assert response.status == 200


async def test_the_context_the_upstream_reports_is_learned_after_its_first_request(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))  # the demo's /props says n_ctx 4096
    huge = "x" * (8 * 5000)
    async with http.post(served.at("/v1/chat/completions"), json=chat("m", "hello")) as response:
        assert response.status == 200
    async with http.post(served.at("/v1/chat/completions"), json=chat("m", huge)) as response:
        assert response.status == 400
        message = (await response.json())["error"]["message"]
        assert "at least 5000 tokens" in message and "4096-token context" in message
        assert "reported" in message
