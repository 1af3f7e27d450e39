"""Preemption over HTTP: a low-priority key's streaming answer is cut for an interactive request."""

from __future__ import annotations

import asyncio
import dataclasses

import aiohttp
import pytest

from llmswap.config.model import ApiKey, Config, SchedulerConfig
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.wait import until
from tests.integration.server.conftest import ServeConfig


def preempting_config() -> Config:
    """bg (slow: 5 tokens a second) and chat, one at a time; sk-batch's requests (priority -5) are
    preempted for sk-user's (preemptBelow 0)."""
    config = exclusive_config(demo_config("bg", "--tokens-per-second", "5"), demo_config("chat"),
                              api_keys=(ApiKey("sk-batch", priority=-5), ApiKey("sk-user")))
    return dataclasses.replace(config, routing=dataclasses.replace(
        config.routing, scheduler=SchedulerConfig(preempt_below=0)))


async def test_a_low_priority_stream_is_cut_and_the_interactive_request_served(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(preempting_config())
    body = {"model": "bg", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000,
            "stream": True}

    started = asyncio.Event()

    async def low_priority_stream() -> None:
        async with http.post(served.at("/v1/chat/completions"), json=body,
                             headers={"Authorization": "Bearer sk-batch"}) as response:
            assert response.status == 200
            async for _ in response.content:
                started.set()

    streaming = asyncio.create_task(low_priority_stream())
    await until(started.is_set, what="bg streaming")
    chat = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with http.post(served.at("/v1/chat/completions"), json=chat,
                         headers={"Authorization": "Bearer sk-user"}) as response:
        assert response.status == 200
    with pytest.raises(aiohttp.ClientPayloadError):
        await streaming  # cut, never passed off as a complete answer
    async with http.get(served.at("/metrics"), headers={"Authorization": "Bearer sk-user"}) as response:
        assert 'llmswap_preemptions_total{reason="higher_priority"} 1.0' in await response.text()



async def test_a_low_priority_answer_granted_at_once_is_ended_with_a_preempted_error(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    # bg is loaded and idle first, so the slow whole answer is granted at once (no queue round trip), and
    # not streamed; the interactive request must still end it, with a clean 503.
    served = await serve_config(preempting_config())
    batch = {"Authorization": "Bearer sk-batch"}
    warm = {"model": "bg", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    async with http.post(served.at("/v1/chat/completions"), json=warm, headers=batch) as response:
        assert response.status == 200
        await response.read()
    slow = http.post(served.at("/v1/chat/completions"), json={**warm, "max_tokens": 1000}, headers=batch)
    answering = asyncio.create_task(slow.__aenter__())

    def serving() -> bool:
        return served.state.router.serving("bg") == 1

    await until(serving, what="bg serving")
    chat = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with http.post(served.at("/v1/chat/completions"), json=chat,
                         headers={"Authorization": "Bearer sk-user"}) as response:
        assert response.status == 200
    cut = await answering
    try:
        assert cut.status == 503
        assert (await cut.json())["error"]["code"] == "preempted"
    finally:
        cut.release()
    assert served.state.router.serving("bg") == 0
    async with http.get(served.at("/metrics"), headers={"Authorization": "Bearer sk-user"}) as response:
        assert 'llmswap_preemptions_total{reason="higher_priority"} 1.0' in await response.text()
