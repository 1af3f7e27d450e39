"""Preemption over real demo upstreams: an interactive request ends the background work holding the GPU.

One model at a time. A background client (priority -10, as the task queue uses) streams a long answer
from `bg`; an interactive request for `chat` arrives. With `preemptBelow: 0` the background request is
preempted — its upstream call is abandoned and its `acquire` raises `Preempted` — and `chat` is loaded
and served within one swap. Without it the interactive request would wait for the whole answer.
"""

from __future__ import annotations

import asyncio
import dataclasses

import aiohttp
import pytest

from llmswap.config.model import SchedulerConfig
from llmswap.router import AcquireOptions, build_router
from llmswap.scheduler.errors import Preempted
from llmswap.scheduler.preemption import REASON_PRIORITY
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.wait import eventually

TASK_PRIORITY = -10


@pytest.mark.timeout(60)
async def test_an_interactive_request_preempts_a_streaming_background_request() -> None:
    config = exclusive_config(demo_config("bg", "--tokens-per-second", "5"), demo_config("chat"))
    config = dataclasses.replace(config, routing=dataclasses.replace(
        config.routing, scheduler=SchedulerConfig(preempt_below=0)))
    router = build_router(config)
    router.start()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000, "stream": True}
    try:
        async with aiohttp.ClientSession() as session:

            async def background() -> int:
                chunks = 0
                as_task = AcquireOptions(priority=TASK_PRIORITY)
                async with router.acquire("bg", as_task) as process, session.post(
                    f"{process.config.proxy}/v1/chat/completions", json={**body, "model": "bg"}
                ) as response:
                    async for _ in response.content:
                        chunks += 1
                return chunks

            task = asyncio.create_task(background())
            async def serving() -> bool:
                return router.snapshot().in_flight.get("bg") == 1

            await eventually(serving, what="bg serving")

            async with router.acquire("chat", AcquireOptions(priority=0)) as process, session.post(
                f"{process.config.proxy}/v1/chat/completions",
                json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            ) as response:
                assert response.status == 200

            with pytest.raises(Preempted, match="preemptBelow"):
                await task
            assert router.scheduler.stats.preempted == {REASON_PRIORITY: 1}  # type: ignore[attr-defined]
            assert sum(router.stats.swaps_by_rule.values()) == 2, "bg, then chat: one swap for chat"
    finally:
        await router.shutdown()
