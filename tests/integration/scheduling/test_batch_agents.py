"""Closed-loop agents over real demo upstreams: the batch scheduler starts far fewer processes than FIFO.

Three agents, each bound to its own model (one model loaded at a time, 1 s startup each), send six
requests each: send, read the answer, think 50 ms, send again. FIFO loads a model for nearly every
request, because whenever one finishes the other agents' requests are already waiting. The batch
scheduler keeps serving the loaded model while its agent keeps coming back. Both routers run side
by side in the same test, so they see the same machine load; only start counts are compared.
"""

from __future__ import annotations

import asyncio
import dataclasses

import aiohttp
import pytest

from llmswap.config.model import BatchSettings, Config, SchedulerConfig
from llmswap.router import Router, build_router
from tests.helpers.models import demo_config, exclusive_config

AGENTS = ("alpha", "beta", "gamma")
REQUESTS = 6
THINK = 0.05  # the agent's think time between an answer and its next request: part of the workload


def agents_config(use: str) -> Config:
    base = exclusive_config(*(demo_config(m, "--startup-delay", "1") for m in AGENTS))
    # Small knobs so the test is short: nothing here should wait for a deadline.
    scheduler = SchedulerConfig(use=use, batch=BatchSettings(max_wait=10.0, min_residency=2.0))
    return dataclasses.replace(base, routing=dataclasses.replace(base.routing, scheduler=scheduler))


async def chat(session: aiohttp.ClientSession, base: str, model: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "next step?"}], "max_tokens": 4}
    async with session.post(f"{base}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        data = await resp.json()
        return str(data["choices"][0]["message"]["content"])


async def run_agents(router: Router) -> list[str]:
    """Run the three agents to completion through `router`; the models started, in order."""
    starts: list[str] = []
    router.add_observer(
        lambda item: starts.append(item.model) if getattr(item, "kind", "") == "starting" else None
    )
    router.start()
    try:
        async with aiohttp.ClientSession() as session:

            async def agent(model: str) -> None:
                for _ in range(REQUESTS):
                    async with router.acquire(model) as process:
                        assert f"demo {model} says" in await chat(session, process.config.proxy, model)
                    await asyncio.sleep(THINK)

            await asyncio.gather(*(agent(m) for m in AGENTS))
    finally:
        await router.shutdown()
    return starts


@pytest.mark.timeout(120)
async def test_batch_starts_far_fewer_processes_than_fifo_for_closed_loop_agents() -> None:
    fifo, batch = build_router(agents_config("fifo")), build_router(agents_config("batch"))
    fifo_starts, batch_starts = await asyncio.gather(run_agents(fifo), run_agents(batch))

    print(f"\nstarts for {len(AGENTS)} agents x {REQUESTS} requests: FIFO {len(fifo_starts)}, "
          f"batch {len(batch_starts)} {dict(batch.stats.swaps_by_rule)}")
    assert len(fifo_starts) >= 2 * REQUESTS, "FIFO loads a model for nearly every request"
    assert set(batch_starts) == set(AGENTS)
    # The first exchange teaches the scheduler: the first model is evicted FIFO's way (`batch.no_gain`), its
    # agent is back 50 ms after its answer, and from then on every model is presumed a closed loop and held
    # while its agent keeps coming back: each model loads once, the first one twice.
    assert len(batch_starts) <= len(AGENTS) + 1
    assert 2 * len(batch_starts) < len(fifo_starts)
    # Every start was a swap the scheduler committed to, with its reason.
    assert sum(batch.stats.swaps_by_rule.values()) == len(batch_starts)
    assert all(rule.startswith("batch.") for rule in batch.stats.swaps_by_rule)
    assert sum(fifo.stats.swaps_by_rule.values()) == len(fifo_starts)
