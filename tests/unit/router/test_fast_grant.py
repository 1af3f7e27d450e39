"""The router's fast path: a request for a ready, free model is granted in `acquire` itself, without a round
trip through the run loop, only while no event waits in the loop's queue (fake processes, one real loop)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from llmswap.config.model import BatchSettings, SchedulerConfig
from llmswap.process.state import ProcessState
from llmswap.router import AcquireOptions
from llmswap.scheduler.errors import ConcurrencyLimit
from tests.unit.router.test_router import config, make_router, serve_once, until


@pytest.mark.parametrize("use", ["fifo", "batch"])
async def test_a_ready_idle_model_is_granted_without_the_run_loop_and_counted_in_flight(use: str) -> None:
    cfg = config("a", "b")
    scheduler = SchedulerConfig(use=use, batch=BatchSettings(max_wait=0.05, min_residency=0.0))
    routing = dataclasses.replace(cfg.routing, scheduler=scheduler)
    router, _ = make_router(dataclasses.replace(cfg, routing=routing))
    await serve_once(router, "a")
    await router.wait_idle()
    handled = router._processed
    admitted: list[ProcessState] = []
    loads: list[float] = []
    asking = AcquireOptions(on_admitted=admitted.append, on_granted=loads.append)
    async with router.acquire("a", asking) as process:
        assert router._processed == handled, "no NewRequest went through the run loop"
        assert process.id == "a"
        assert router.snapshot().in_flight == {"a": 1}
        assert router.serving("a") == 1 and router.busy
        assert admitted == [ProcessState.READY] and loads == [0.0]
    await router.wait_idle()
    assert router._processed == handled + 1, "its ServeDone went through the run loop"
    assert router.snapshot().in_flight == {}
    assert await serve_once(router, "b") == "b", "a is free to be evicted again"
    await router.shutdown()


async def test_a_request_behind_an_unhandled_unload_waits_for_it() -> None:
    # The unload's event is posted, and the loop has not handled it yet when the request arrives: the fast
    # path must decline (the scheduler has not seen the unload), so the request queues behind it and is
    # served by the model started again, not by the process being stopped.
    router, script = make_router(config("a"))
    await serve_once(router, "a")
    await router.wait_idle()
    unloading = asyncio.create_task(router.unload(["a"]))
    wanting = asyncio.create_task(serve_once(router, "a"))  # runs before the loop reads the UnloadRequest
    assert await wanting == "a"
    await unloading
    assert script.starts == {"a": 2}
    await router.wait_idle()
    assert router.snapshot().in_flight == {}
    await router.shutdown()


async def test_a_busy_model_queues_the_newcomer_through_the_run_loop() -> None:
    router, _ = make_router(config("a", limit=1))
    hold = asyncio.Event()
    first = asyncio.create_task(serve_once(router, "a", hold))
    await router.wait_idle()
    await until(lambda: router.snapshot().in_flight == {"a": 1})
    handled = router._processed
    second = asyncio.create_task(serve_once(router, "a"))
    await asyncio.sleep(0)
    await router.wait_idle()
    assert router._processed == handled + 1, "at its concurrencyLimit: posted to the run loop, refused there"
    with pytest.raises(ConcurrencyLimit):
        await second
    hold.set()
    assert await first == "a"
    await router.shutdown()


async def test_a_request_ending_with_nothing_queued_is_counted_out_on_the_spot() -> None:
    router, _ = make_router(config("a"))
    await serve_once(router, "a")
    await router.wait_idle()
    handled = router._processed
    async with router.acquire("a"):
        assert router.snapshot().in_flight == {"a": 1}
    assert router.snapshot().in_flight == {}, "its ServeDone was handled as it ended, nothing being ahead"
    assert router._processed == handled + 1
    await router.shutdown()


async def test_a_request_ending_behind_a_posted_event_posts_its_end_behind_it() -> None:
    router, _ = make_router(config("a"))
    await serve_once(router, "a")
    await router.wait_idle()
    async with router.acquire("a"):
        router.poke()  # an event the run loop has not handled yet
    assert router.snapshot().in_flight == {"a": 1}, "its ServeDone waits behind the Tick"
    await router.wait_idle()
    assert router.snapshot().in_flight == {}
    await router.shutdown()


async def test_a_model_stopped_behind_the_schedulers_back_is_not_granted_from_the_express_lane() -> None:
    # Two warm requests leave the express lane's verdict for a; the process then stops on its own (its TTL),
    # which the router hears as a process event: the next request starts a again instead of being handed a
    # stopped process.
    router, script = make_router(config("a"))
    for _ in range(2):
        assert await serve_once(router, "a") == "a"
    await router.wait_idle()
    process = router.processes["a"]
    await process.expire()  # type: ignore[attr-defined]
    await router.wait_idle()
    assert process.state is ProcessState.STOPPED
    assert await serve_once(router, "a") == "a"
    assert script.starts == {"a": 2}
    await router.shutdown()


def test_a_policy_that_overrides_a_grant_hook_is_asked_on_every_grant() -> None:
    from llmswap.router.policy import RouterPolicy
    from llmswap.router.vram import VramPolicy

    class Counting(RouterPolicy):
        def granted(self, model: str) -> None:
            pass

    class Plain(RouterPolicy):
        def router_extras(self) -> dict[str, object]:
            return {}

    assert (RouterPolicy.adjusts, Plain.adjusts) == (False, False)
    assert Counting.adjusts and VramPolicy.adjusts
