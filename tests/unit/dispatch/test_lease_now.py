"""`Dispatcher.lease_now`: a lease granted synchronously when the model is ready and free, released by its
caller exactly once (`HeldLease.release`), with everything `Dispatcher.lease` does: counted in flight by the
scheduler and by the process until released, one `DispatchRecord`, preemption. Fake processes, one real loop,
a real router and a real dispatcher."""

from __future__ import annotations

import asyncio

import pytest

from llmswap.config.model import (
    Config,
    GroupConfig,
    ModelConfig,
    RouterConfig,
    RoutingConfig,
    SchedulerConfig,
)
from llmswap.router import AcquireOptions, build_router
from llmswap.router.base import BaseRouter
from llmswap.router.handover import successor_router
from llmswap.router.types import NO_OPTIONS
from llmswap.scheduler.errors import Preempted
from llmswap.upstream import Dispatcher, DispatchRecord, HeldLease, UpstreamPool
from tests.helpers.fake_process import FakeProcess, FakeScript, fake_factory

TASK = -10  # the task queue's priority: below preemptBelow 0


def config(*models: str, limit: int = 10, preempt_below: int | None = None, use: str = "fifo") -> Config:
    mcs = {m: ModelConfig(id=m, cmd=("serve", m), concurrency_limit=limit) for m in models}
    groups = {"(default)": GroupConfig("(default)", members=tuple(sorted(models)))}  # one model at a time
    scheduler = SchedulerConfig(use=use, preempt_below=preempt_below)
    return Config(models=mcs, routing=RoutingConfig(router=RouterConfig(use="group", groups=groups),
                                                    scheduler=scheduler))


class Setup:
    def __init__(self, cfg: Config) -> None:
        self.script = FakeScript()
        self.router: BaseRouter = build_router(cfg, process_factory=fake_factory(self.script))
        self.router.start()
        self.records: list[DispatchRecord] = []
        self.dispatcher = Dispatcher(UpstreamPool(), lambda: self.router)
        self.dispatcher.add_observer(self.records.append)

    def process(self, model: str) -> FakeProcess:
        process = self.router.processes[model]
        assert isinstance(process, FakeProcess)
        return process

    async def ready(self, model: str) -> None:
        async with self.dispatcher.lease(model, origin="task"):
            pass
        await self.router.wait_idle()
        self.records.clear()

    def now(self, model: str, options: AcquireOptions = NO_OPTIONS) -> HeldLease | None:
        return self.dispatcher.lease_now(model, options, origin="http")


async def test_a_ready_free_model_is_leased_at_once_and_counted_in_flight_until_released() -> None:
    s = Setup(config("a"))
    await s.ready("a")
    handled = s.router._processed
    loads: list[float] = []
    held = s.now("a", AcquireOptions(on_granted=loads.append))
    assert held is not None
    assert held.lease.process is s.router.processes["a"]
    assert held.lease.upstream is s.dispatcher.pool.upstream("a", held.lease.config.timeouts)
    assert held.lease.waited >= 0 and loads == [0.0]
    assert s.router.snapshot().in_flight == {"a": 1} and s.process("a").in_flight == 1
    assert s.router._processed == handled, "granted without the run loop"
    assert s.records == [], "recorded as it is released, not before"
    assert held.release() is None
    assert s.router.snapshot().in_flight == {} and s.process("a").in_flight == 0
    assert s.router._processed == handled + 1, "its end handled on the spot"
    [record] = s.records
    assert (record.model, record.origin, record.error) == ("a", "http", None)
    assert record.waited is not None and record.seconds >= record.waited
    await s.router.shutdown()


async def test_a_second_release_changes_nothing() -> None:
    s = Setup(config("a"))
    await s.ready("a")
    first = s.now("a")
    second = s.now("a")
    assert first is not None and second is not None
    first.release(RuntimeError("upstream broke"))
    first.release()
    first.release(RuntimeError("again"))
    assert s.router.snapshot().in_flight == {"a": 1}, "the other lease is still held"
    assert s.process("a").in_flight == 1
    second.release()
    assert s.router.snapshot().in_flight == {}
    assert [r.error for r in s.records] == ["upstream broke", None]
    await s.router.shutdown()


async def test_with_a_held_lease_releases_it_once_with_the_blocks_error_and_lets_the_error_through() -> None:
    s = Setup(config("a"))
    await s.ready("a")
    held = s.now("a")
    assert held is not None
    with pytest.raises(RuntimeError, match="upstream broke"), held:
        assert s.router.snapshot().in_flight == {"a": 1}
        raise RuntimeError("upstream broke")
    with held:  # released already: nothing changes
        pass
    again = s.now("a")
    assert again is not None
    with again:
        pass
    assert s.router.snapshot().in_flight == {} and s.process("a").in_flight == 0
    assert [r.error for r in s.records] == ["upstream broke", None]
    await s.router.shutdown()


async def test_a_callback_that_fails_at_the_grant_leaves_nothing_in_flight() -> None:
    s = Setup(config("a"))
    await s.ready("a")

    def broken(load: float) -> None:
        raise RuntimeError("observer bug")

    with pytest.raises(RuntimeError, match="observer bug"):
        s.now("a", AcquireOptions(on_granted=broken))
    assert s.router.snapshot().in_flight == {} and s.process("a").in_flight == 0
    assert [r.error for r in s.records] == ["observer bug"]
    await s.router.shutdown()


async def test_a_model_that_is_not_ready_is_not_leased_at_once_and_nothing_starts() -> None:
    s = Setup(config("a"))
    handled = s.router._processed
    assert s.now("a") is None
    await s.router.wait_idle()
    assert s.script.starts == {} and s.router._processed == handled
    assert s.router.snapshot().in_flight == {} and s.records == []
    async with s.dispatcher.lease("a", origin="http") as lease:  # what the caller takes instead
        assert lease.process.id == "a"
    assert s.script.starts == {"a": 1} and [r.error for r in s.records] == [None]
    await s.router.shutdown()


async def test_nothing_is_leased_at_once_behind_an_event_the_run_loop_has_not_handled() -> None:
    s = Setup(config("a"))
    await s.ready("a")
    s.router.poke()  # posted, not handled yet: the scheduler has not seen the world it describes
    assert s.now("a") is None
    await s.router.wait_idle()
    held = s.now("a")
    assert held is not None
    held.release()
    await s.router.shutdown()


async def test_a_model_at_its_concurrency_limit_or_a_request_with_a_deadline_is_not_leased_at_once() -> None:
    s = Setup(config("a", limit=1))
    await s.ready("a")
    held = s.now("a")
    assert held is not None
    assert s.now("a") is None, "at its concurrencyLimit: the router refuses it, through the queue"
    held.release()
    assert s.now("a", AcquireOptions(deadline_ms=5000)) is None, "a deadline is judged by on_request"
    assert s.router.snapshot().in_flight == {} and s.process("a").in_flight == 0
    await s.router.shutdown()


async def test_a_retired_router_leases_nothing_at_once_and_its_held_lease_still_ends_there() -> None:
    s = Setup(config("a"))
    await s.ready("a")
    old = s.router
    held = s.now("a")
    assert held is not None
    s.router = successor_router(old, config("a"), process_factory=fake_factory(s.script))
    s.router.start()
    assert s.dispatcher.lease_now("a", origin="http", router=old) is None, "retired: the successor decides"
    assert old.serving("a") == 1 and s.router.snapshot().in_flight == {}
    held.release()
    await old.wait_idle()
    assert old.serving("a") == 0 and not old.busy
    assert s.process("a").in_flight == 0
    later = s.now("a")
    assert later is not None and later.lease.process is s.router.processes["a"]
    later.release()
    await s.router.shutdown()
    await old.shutdown()


async def test_a_held_lease_is_preempted_for_an_interactive_request() -> None:
    s = Setup(config("bg", "chat", preempt_below=0))
    await s.ready("bg")
    serving = asyncio.Event()
    relayed: list[str] = []

    async def background() -> None:
        # What the front does with a held lease: serve, then release with what ended it.
        held = s.now("bg", AcquireOptions(priority=TASK))
        assert held is not None
        with held:  # released with what ended the block: the preemption's cancel comes out as Preempted
            serving.set()
            await asyncio.sleep(30)  # a long answer being relayed
            relayed.append("whole")

    task = asyncio.create_task(background())
    await serving.wait()
    async with s.dispatcher.lease("chat", AcquireOptions(priority=0), origin="http") as lease:
        assert lease.process.id == "chat"
    with pytest.raises(Preempted, match="preemptBelow"):
        await task
    assert not task.cancelled() and relayed == []
    assert [(r.model, r.error is not None and "preemptBelow" in r.error) for r in s.records] == [
        ("bg", True), ("chat", False)]
    await s.router.wait_idle()
    assert s.router.snapshot().in_flight == {} and s.process("bg").in_flight == 0
    await s.router.shutdown()


async def test_a_lease_released_after_its_task_ended_does_not_cancel_what_the_task_does_next() -> None:
    # A preemption the scheduler decides after the lease was released (its ServeDone still queued behind
    # another event) finds no task to cancel.
    s = Setup(config("a", preempt_below=0))
    await s.ready("a")
    held = s.now("a", AcquireOptions(priority=TASK))
    assert held is not None
    s.router.poke()  # the release is posted behind this
    held.release()
    granted = next(iter(s.router.scheduler._granted))  # type: ignore[attr-defined]
    s.router.preempt(granted, "preempted late (routing.scheduler.settings.preemptBelow: 0)")
    await asyncio.sleep(0)
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]
    await s.router.wait_idle()
    assert s.router.snapshot().in_flight == {}
    await s.router.shutdown()


@pytest.mark.parametrize("use", ["fifo", "batch"])
async def test_lease_and_lease_now_take_turns_on_the_same_books(use: str) -> None:
    s = Setup(config("a", use=use))
    await s.ready("a")
    held = s.now("a")
    assert held is not None
    async with s.dispatcher.lease("a", origin="task"):
        assert s.router.snapshot().in_flight == {"a": 2} and s.process("a").in_flight == 2
        held.release()
        assert s.router.snapshot().in_flight == {"a": 1}
    assert s.router.snapshot().in_flight == {} and s.process("a").in_flight == 0
    assert sorted(r.origin for r in s.records) == ["http", "task"]
    await s.router.shutdown()
