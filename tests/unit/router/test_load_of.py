"""`Router.load_of`: what a request arriving now would meet, as selectors read it (fake processes)."""

from __future__ import annotations

import asyncio

from llmswap.config.model import Config, GroupConfig, ModelConfig, RouterConfig, RoutingConfig
from llmswap.process.state import ProcessState
from llmswap.router import build_router
from llmswap.router.router import Router
from tests.helpers.fake_process import FakeScript, fake_factory


def one_model(limit: int) -> Router:
    models = {"b": ModelConfig(id="b", cmd=("true",), concurrency_limit=limit)}
    groups = {"(default)": GroupConfig("(default)", members=("b",))}
    config = Config(models=models, routing=RoutingConfig(router=RouterConfig(use="group", groups=groups)))
    router = build_router(config, process_factory=fake_factory(FakeScript()))
    router.start()
    return router


async def hold(router: Router, release: asyncio.Event) -> None:
    async with router.acquire("b"):
        await release.wait()


async def test_load_of_reports_state_in_flight_and_room() -> None:
    router = one_model(limit=2)
    release = asyncio.Event()
    try:
        assert router.load_of("nope") is None
        first = router.load_of("b")
        assert first is not None and (first.state, first.in_flight, first.accepts) == (
            ProcessState.STOPPED, 0, True)
        holders = [asyncio.create_task(hold(router, release)) for _ in range(2)]
        await asyncio.sleep(0)
        await router.wait_idle()
        await router.processes["b"].ensure_ready()
        await router.wait_idle()
        load = router.load_of("b")
        assert load is not None and (load.state, load.in_flight, load.accepts) == (
            ProcessState.READY, 2, False)  # its concurrencyLimit of 2 is taken
        release.set()
        await asyncio.gather(*holders)
    finally:
        await router.shutdown(1.0)


async def test_requests_posted_in_the_same_loop_step_count_before_the_scheduler_sees_them() -> None:
    # Two selector choices in one step: the second must see the first request, which the run loop has
    # not handled yet, or both would pick the one free slot.
    router = one_model(limit=1)
    release = asyncio.Event()
    try:
        holder = asyncio.create_task(hold(router, release))
        await asyncio.sleep(0)  # the holder posts its request; the run loop has not run since
        counts = router.snapshot()
        assert counts.in_flight.get("b", 0) == 0 and counts.waiting.get("b", 0) == 0  # not seen yet
        load = router.load_of("b")
        assert load is not None and load.waiting == 1 and not load.accepts
        release.set()
        await holder
        await router.wait_idle()
        after = router.load_of("b")
        assert after is not None and after.waiting == 0 and after.accepts
    finally:
        await router.shutdown(1.0)
