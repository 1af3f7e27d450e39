"""`Dispatcher.lease`: the model granted by the live router, counted in flight by the scheduler and by its
process until the block ends (with the block's error, which goes through), the pool's connections to it,
and a preemption's cancel coming out as `Preempted`. Fake processes, one real loop, a real router and a real
dispatcher."""

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
from llmswap.router.handover import successor_router
from llmswap.router.router import Router
from llmswap.scheduler.errors import Preempted
from llmswap.upstream import Dispatcher, UpstreamPool
from tests.helpers.fake_process import FakeProcess, FakeScript, fake_factory

TASK = -10  # the task queue's priority: below preemptBelow 0


def config(*models: str, preempt_below: int | None = None) -> Config:
    mcs = {m: ModelConfig(id=m, cmd=("serve", m)) for m in models}
    groups = {"(default)": GroupConfig("(default)", members=tuple(sorted(models)))}  # one model at a time
    scheduler = SchedulerConfig(preempt_below=preempt_below)
    return Config(models=mcs, routing=RoutingConfig(router=RouterConfig(use="group", groups=groups),
                                                    scheduler=scheduler))


class Setup:
    def __init__(self, cfg: Config) -> None:
        self.script = FakeScript()
        self.router: Router = build_router(cfg, process_factory=fake_factory(self.script))
        self.router.start()
        self.dispatcher = Dispatcher(UpstreamPool(), lambda: self.router)

    def process(self, model: str) -> FakeProcess:
        process = self.router.processes[model]
        assert isinstance(process, FakeProcess)
        return process


async def test_a_lease_starts_its_model_and_counts_in_flight_until_the_block_ends() -> None:
    s = Setup(config("a"))
    loads: list[float] = []
    async with s.dispatcher.lease("a", AcquireOptions(on_granted=loads.append)) as lease:
        assert lease.process is s.router.processes["a"]
        assert lease.upstream is s.dispatcher.pool.upstream("a", lease.config.timeouts)
        assert lease.waited >= 0 and len(loads) == 1
        assert s.router.snapshot().in_flight == {"a": 1} and s.process("a").in_flight == 1
    await s.router.wait_idle()
    assert s.router.snapshot().in_flight == {} and s.process("a").in_flight == 0
    assert s.script.starts == {"a": 1}
    await s.router.shutdown()


async def test_an_error_in_the_block_releases_the_lease_and_goes_through() -> None:
    s = Setup(config("a"))
    with pytest.raises(RuntimeError, match="upstream broke"):
        async with s.dispatcher.lease("a"):
            raise RuntimeError("upstream broke")
    await s.router.wait_idle()
    assert s.router.snapshot().in_flight == {} and s.process("a").in_flight == 0
    async with s.dispatcher.lease("a"):  # the model serves the next one as before
        assert s.router.snapshot().in_flight == {"a": 1}
    await s.router.shutdown()


async def test_a_lease_is_preempted_for_an_interactive_request() -> None:
    s = Setup(config("bg", "chat", preempt_below=0))
    serving = asyncio.Event()
    relayed: list[str] = []

    async def background() -> None:
        async with s.dispatcher.lease("bg", AcquireOptions(priority=TASK)):
            serving.set()
            await asyncio.sleep(30)  # a long answer being relayed
            relayed.append("whole")

    task = asyncio.create_task(background())
    await serving.wait()
    async with s.dispatcher.lease("chat", AcquireOptions(priority=0)) as lease:
        assert lease.process.id == "chat"
    with pytest.raises(Preempted, match="preemptBelow"):
        await task
    assert not task.cancelled() and relayed == []
    await s.router.wait_idle()
    assert s.router.snapshot().in_flight == {} and s.process("bg").in_flight == 0
    await s.router.shutdown()


async def test_a_lease_taken_on_a_retired_router_ends_there_and_the_next_goes_to_its_successor() -> None:
    s = Setup(config("a"))
    old = s.router
    async with s.dispatcher.lease("a") as first:
        s.router = successor_router(old, config("a"), process_factory=fake_factory(s.script))
        s.router.start()
        assert old.serving("a") == 1
    await old.wait_idle()
    assert old.serving("a") == 0 and not old.busy
    async with s.dispatcher.lease("a") as later:
        assert later.process is s.router.processes["a"] and later.process is first.process  # adopted
    await s.router.shutdown()
    await old.shutdown()
