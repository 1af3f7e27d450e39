"""Router over real demo upstreams: swaps stop the previous model, busy models are never evicted."""

from __future__ import annotations

import asyncio

import aiohttp
import psutil

from llmswap.process.state import ProcessState
from llmswap.router import Router, build_router
from tests.helpers.models import demo_config, exclusive_config


async def chat(session: aiohttp.ClientSession, base: str, model: str, max_tokens: int = 4) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    async with session.post(f"{base}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        data = await resp.json()
        return str(data["choices"][0]["message"]["content"])


def starts_of(router: Router) -> list[str]:
    kinds: list[str] = []
    router.add_observer(lambda item: kinds.append(item.model) if getattr(item, "kind", "") == "starting"
                        else None)
    return kinds


async def test_swap_stops_previous_model() -> None:
    router = build_router(exclusive_config(demo_config("a"), demo_config("b")))
    router.start()
    try:
        async with aiohttp.ClientSession() as session:
            async with router.acquire("a") as process:
                assert "demo a says" in await chat(session, process.config.proxy, "a")
                pid_a = process.pid
            assert pid_a is not None
            async with router.acquire("b") as process:
                assert "demo b says" in await chat(session, process.config.proxy, "b")
        assert router.processes["a"].state is ProcessState.STOPPED
        assert not psutil.pid_exists(pid_a) or psutil.Process(pid_a).status() == psutil.STATUS_ZOMBIE
    finally:
        await router.shutdown()


async def test_request_for_other_model_waits_for_busy_model() -> None:
    slow = demo_config("a", "--tokens-per-second", "40")
    router = build_router(exclusive_config(slow, demo_config("b")))
    router.start()
    order: list[str] = []
    try:
        async with aiohttp.ClientSession() as session:
            async with router.acquire("a") as process:
                a_serving = asyncio.create_task(chat(session, process.config.proxy, "a", max_tokens=12))

                async def want_b() -> None:
                    async with router.acquire("b") as b:
                        order.append("b granted")
                        await chat(session, b.config.proxy, "b")

                b_task = asyncio.create_task(want_b())
                await a_serving
                order.append("a finished")
                assert router.processes["b"].state is ProcessState.STOPPED  # not even started yet
            await b_task
        assert order == ["a finished", "b granted"]
        assert router.processes["a"].state is ProcessState.STOPPED
    finally:
        await router.shutdown()


async def test_concurrent_requests_for_loading_model_start_it_once() -> None:
    router = build_router(exclusive_config(demo_config("a", "--startup-delay", "0.3")))
    starts = starts_of(router)
    router.start()
    try:
        async with aiohttp.ClientSession() as session:

            async def one() -> str:
                async with router.acquire("a") as process:
                    return await chat(session, process.config.proxy, "a")

            answers = await asyncio.gather(one(), one(), one())
        assert all("demo a says" in answer for answer in answers)
        assert starts == ["a"]
    finally:
        await router.shutdown()
    assert router.processes["a"].state is ProcessState.SHUTDOWN
