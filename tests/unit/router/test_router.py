"""Router mechanism with fake processes: run loop, grants, cancellation, unload, shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from llmswap.config.model import Config, GroupConfig, ModelConfig, RouterConfig, RoutingConfig
from llmswap.process.state import ProcessState
from llmswap.router import AcquireOptions, build_router
from llmswap.router.router import Router
from llmswap.router.types import SwapFinished, SwapStarted
from llmswap.scheduler.errors import ConcurrencyLimit, ModelNotFound, ModelUnloaded, ShuttingDown, SwapFailed
from tests.helpers import wait
from tests.helpers.fake_process import FakeProcess, FakeScript, fake_factory


def config(*models: str, groups: dict[str, GroupConfig] | None = None, limit: int = 10) -> Config:
    mcs = {m: ModelConfig(id=m, cmd=("true",), concurrency_limit=limit) for m in models}
    if groups is None:
        groups = {"(default)": GroupConfig("(default)", members=tuple(sorted(models)))}
    return Config(models=mcs, routing=RoutingConfig(router=RouterConfig(use="group", groups=groups)))


def make_router(cfg: Config, script: FakeScript | None = None) -> tuple[Router, FakeScript]:
    script = script or FakeScript()
    router = build_router(cfg, process_factory=fake_factory(script))
    router.start()
    return router, script


async def until(predicate: Callable[[], bool], within: float = 10.0) -> None:
    """Poll the router's own state (in-process, cheap) every millisecond."""
    await wait.until(predicate, within=within, interval=0.001)


async def settle(router: Router) -> None:
    """Let freshly created request tasks post their events, then wait until the router handled them all."""
    await asyncio.sleep(0)
    await router.wait_idle()


async def serve_once(router: Router, model: str, hold: asyncio.Event | None = None) -> str:
    async with router.acquire(model) as process:
        assert process.state is ProcessState.READY
        if hold is not None:
            await hold.wait()
        return process.id


async def test_request_starts_model_and_serves() -> None:
    router, script = make_router(config("a", "b"))
    assert await serve_once(router, "a") == "a"
    assert script.starts == {"a": 1}
    await router.wait_idle()
    assert router.snapshot().in_flight == {}
    await router.shutdown()


async def test_swap_stops_previous_model_in_exclusive_group() -> None:
    router, _ = make_router(config("a", "b"))
    seen: list[object] = []
    router.add_observer(seen.append)
    await serve_once(router, "a")
    await serve_once(router, "b")
    assert router.processes["a"].state is ProcessState.STOPPED
    assert router.processes["b"].state is ProcessState.READY
    plans = [item.plan for item in seen if isinstance(item, SwapStarted)]
    assert [(p.model, p.evict) for p in plans] == [("a", ()), ("b", ("a",))]
    assert router.stats.evictions == {"a": 1}
    assert any(isinstance(item, SwapFinished) and item.error is None for item in seen)
    await router.shutdown()


async def test_concurrent_requests_for_loading_model_share_one_start() -> None:
    script = FakeScript(start_delay=lambda m: 0.05)
    router, _ = make_router(config("a"), script)
    results = await asyncio.gather(*(serve_once(router, "a") for _ in range(3)))
    assert results == ["a", "a", "a"]
    assert script.starts == {"a": 1}
    await router.shutdown()


async def test_request_for_other_model_waits_until_busy_model_finishes() -> None:
    router, script = make_router(config("a", "b"))
    hold = asyncio.Event()
    serving_a = asyncio.create_task(serve_once(router, "a", hold))
    await until(lambda: router.snapshot().in_flight.get("a") == 1)
    want_b = asyncio.create_task(serve_once(router, "b"))
    await settle(router)
    assert not want_b.done()
    assert router.processes["a"].state is ProcessState.READY  # never evicted while busy
    assert "b" not in script.starts
    hold.set()
    assert await serving_a == "a"
    assert await want_b == "b"
    await router.shutdown()


async def test_unknown_model_is_rejected() -> None:
    router, _ = make_router(config("a"))
    with pytest.raises(ModelNotFound):
        await serve_once(router, "ghost")
    await router.shutdown()


async def test_failed_start_errors_every_waiter_and_next_request_retries() -> None:
    attempts = {"n": 0}

    def fails(model: str) -> bool:
        attempts["n"] += 1
        return attempts["n"] == 1

    router, script = make_router(config("a"), FakeScript(start_delay=lambda m: 0.01, fails=fails))
    results = await asyncio.gather(*(serve_once(router, "a") for _ in range(2)), return_exceptions=True)
    assert all(isinstance(r, SwapFailed) for r in results)
    assert "exited prematurely" in str(results[0])
    assert await serve_once(router, "a") == "a"
    assert script.starts == {"a": 2}
    await router.shutdown()


async def test_concurrency_limit_rejects_with_retry_after() -> None:
    router, _ = make_router(config("a", limit=1))
    hold = asyncio.Event()
    first = asyncio.create_task(serve_once(router, "a", hold))
    await until(lambda: router.snapshot().in_flight.get("a") == 1)
    with pytest.raises(ConcurrencyLimit) as info:
        await serve_once(router, "a")
    assert info.value.status == 429 and info.value.retry_after is not None
    hold.set()
    await first
    await router.shutdown()


async def test_cancelled_waiter_leaves_queue_and_never_triggers_swap() -> None:
    router, script = make_router(config("a", "b"))
    hold = asyncio.Event()
    serving_a = asyncio.create_task(serve_once(router, "a", hold))
    await until(lambda: router.snapshot().in_flight.get("a") == 1)
    want_b = asyncio.create_task(serve_once(router, "b"))
    await settle(router)
    assert router.snapshot().waiting == {"b": 1}
    want_b.cancel()
    with pytest.raises(asyncio.CancelledError):
        await want_b
    await router.wait_idle()
    assert router.snapshot().waiting == {}
    hold.set()
    await serving_a
    await router.wait_idle()
    assert "b" not in script.starts
    assert router.processes["a"].state is ProcessState.READY
    await router.shutdown()


async def test_grant_in_the_same_instant_as_cancel_releases_in_flight() -> None:
    # The grant lands, then the waiting task is cancelled before it resumes: the grant counted,
    # so acquire() must post ServeDone or the model could never be evicted again.
    router, _ = make_router(config("a", "b"))
    await serve_once(router, "a")
    waiter = asyncio.create_task(serve_once(router, "a"))
    grant = router.work.grant_serve

    def grant_then_cancel(req, model):  # type: ignore[no-untyped-def]
        granted = grant(req, model)
        waiter.cancel()  # in the same run-loop step: the waiter has not resumed yet
        return granted

    router.work.grant_serve = grant_then_cancel  # type: ignore[method-assign]
    with pytest.raises(asyncio.CancelledError):
        await waiter
    router.work.grant_serve = grant  # type: ignore[method-assign]
    await router.wait_idle()
    assert router.snapshot().in_flight == {}
    assert await serve_once(router, "b") == "b"  # a is evictable
    await router.shutdown()


async def test_unload_fails_waiters_and_returns_when_processes_are_dead() -> None:
    script = FakeScript(start_delay=lambda m: 0.2, stop_delay=0.01)
    router, _ = make_router(config("a"), script)
    waiting = asyncio.create_task(serve_once(router, "a"))
    await until(lambda: router.processes["a"].state is ProcessState.STARTING)
    await router.unload(["a"])
    assert router.processes["a"].state is ProcessState.STOPPED
    with pytest.raises(ModelUnloaded):
        await waiting
    assert await serve_once(router, "a") == "a"  # usable again afterwards
    await router.unload()
    assert router.processes["a"].state is ProcessState.STOPPED
    await router.shutdown()


async def test_shutdown_fails_waiters_and_stops_everything() -> None:
    router, _ = make_router(config("a", "b"), FakeScript(start_delay=lambda m: 5.0))
    waiting = asyncio.create_task(serve_once(router, "a"))
    await until(lambda: router.processes["a"].state is ProcessState.STARTING)
    await router.shutdown()
    with pytest.raises(ShuttingDown):
        await waiting
    assert all(p.state is ProcessState.SHUTDOWN for p in router.processes.values())
    with pytest.raises(ShuttingDown):
        await serve_once(router, "a")
    with pytest.raises(RuntimeError, match="already in progress"):
        await router.shutdown()


async def test_unexpected_stop_reaches_scheduler_and_model_restarts() -> None:
    router, script = make_router(config("a"))
    await serve_once(router, "a")
    process = router.processes["a"]
    assert isinstance(process, FakeProcess)
    await process.expire()  # a TTL expiry, behind the scheduler's back
    await router.wait_idle()
    assert await serve_once(router, "a") == "a"
    assert script.starts == {"a": 2}
    await router.shutdown()


async def test_a_backlog_that_grew_while_its_request_ran_keeps_the_model_for_the_next_one() -> None:
    router, script = make_router(config("a", "b"))
    behind = [0]  # a task lane's queue behind the request in hand: read as it is posted and as it ends
    hold = asyncio.Event()
    first = asyncio.create_task(_serve_with_backlog(router, "a", behind, hold))
    await until(lambda: router.snapshot().in_flight == {"a": 1})
    other = asyncio.create_task(serve_once(router, "b"))
    await settle(router)
    behind[0] = 1  # one more task of its type was queued meanwhile
    hold.set()
    await first
    await settle(router)
    assert script.starts == {"a": 1}  # b waits: a's next request was announced
    behind[0] = 0
    await _serve_with_backlog(router, "a", behind, None)
    assert await other == "b"
    assert script.starts == {"a": 1, "b": 1}
    await router.shutdown()


async def _serve_with_backlog(
    router: Router, model: str, behind: list[int], hold: asyncio.Event | None
) -> None:
    async with router.acquire(model, AcquireOptions(backlog=lambda: behind[0])):
        if hold is not None:
            await hold.wait()
