"""A worker's leases granted by the main process's scheduler over a real control channel (a socketpair, one
loop): counted in flight there until the worker ends them, queued there when they must wait, refused with
the scheduler's own error, shown in main's in-flight list with a cancel that reaches the worker, preempted
by main, and all ended when the worker goes away. Fake processes, a real router and dispatcher."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from llmswap.config.model import Config
from llmswap.dispatch import UpstreamPool
from llmswap.router import AcquireOptions
from llmswap.router.types import NO_OPTIONS
from llmswap.scheduler.errors import Preempted
from llmswap.workers.channel import Channel
from llmswap.workers.grants import Entries, GrantService, RemoteHolder, Shown
from llmswap.workers.leases import MainGone, Refused, RemoteLeases
from tests.unit.dispatch.test_lease_now import TASK, Setup, config

SHOWN = Shown("POST", "/v1/chat/completions", (("Content-Type", "application/json"),), "127.0.0.1")


class Listed:
    """Main's in-flight list, as the server keeps it: entries that can be cancelled through their holder."""

    def __init__(self) -> None:
        self.entries: dict[int, tuple[Shown, str, RemoteHolder]] = {}
        self._next = 0

    def open(self, shown: Shown, model: str, holder: RemoteHolder) -> object:
        self._next += 1
        self.entries[self._next] = (shown, model, holder)
        return self._next

    def close(self, entry: object) -> None:
        self.entries.pop(entry, None)  # type: ignore[call-overload]

    def cancel_all(self) -> None:
        for _, _, holder in list(self.entries.values()):
            holder.cancel()


class Pair:
    """Main (a router with a dispatcher and a grant service) and one worker, joined by a socketpair (both
    ends closed after the test: `_channels_closed`)."""

    joined: list[Channel] = []  # both ends of every pair of the test running

    def __init__(self, cfg: Config, entries: Entries | None = None) -> None:
        self.main = Setup(cfg)
        self.listed = Listed()
        self.grants = GrantService(lambda: self.main.dispatcher, entries or self.listed)
        self.leases = RemoteLeases(UpstreamPool())
        self.cfg = cfg

    async def join(self) -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        _, self.main_end = await loop.create_unix_connection(
            lambda: Channel(self.grants.on_message, self.grants.on_lost), sock=ours)
        _, worker_end = await loop.create_unix_connection(
            lambda: Channel(self.leases.on_message, self.leases.on_lost), sock=theirs)
        self.leases.channel = worker_end
        Pair.joined += (self.main_end, worker_end)

    def lease(self, model: str, options: AcquireOptions = NO_OPTIONS, on_cancel: Any = None) -> Any:
        return self.leases.lease(self.cfg.models[model], options, SHOWN, on_cancel or (lambda _: None))

    async def settle(self) -> None:
        for _ in range(5):  # a message each way, each a loop turn to write and one to read
            await asyncio.sleep(0)
        await self.main.router.wait_idle()


@pytest.fixture(autouse=True)
async def _channels_closed() -> AsyncIterator[None]:
    yield
    joined, Pair.joined = Pair.joined, []
    for channel in joined:
        channel.close()
    await asyncio.sleep(0)  # the transports close on the next turn of the loop


async def a_held_and_b_waiting(pair: Pair) -> tuple[Any, asyncio.Task[Any]]:
    """One model of the group at a time: a's lease held, b's asked for and waiting in main's queue."""
    held = pair.lease("a")
    await held.__aenter__()
    waiting = asyncio.create_task(pair.lease("b").__aenter__())
    await pair.settle()
    assert pair.main.router.snapshot().waiting == {"b": 1}
    return held, waiting


async def started(pair: Pair, *models: str) -> Pair:
    for model in models:
        await pair.main.ready(model)
    await pair.join()
    return pair


async def test_a_lease_granted_by_main_counts_in_flight_there_until_the_worker_ends_it() -> None:
    pair = await started(Pair(config("a")), "a")
    loads: list[float] = []
    async with pair.lease("a", AcquireOptions(on_granted=loads.append)) as lease:
        assert lease.config is pair.cfg.models["a"] and lease.waited >= 0 and loads == [0.0]
        assert pair.main.router.snapshot().in_flight == {"a": 1} and pair.main.process("a").in_flight == 1
        [(shown, model, _)] = pair.listed.entries.values()
        assert (shown, model) == (SHOWN, "a")
    await pair.settle()
    assert pair.main.router.snapshot().in_flight == {} and pair.main.process("a").in_flight == 0
    assert pair.listed.entries == {} and len(pair.grants) == 0 and len(pair.leases) == 0
    [record] = pair.main.records
    assert (record.model, record.origin, record.error) == ("a", "http", None)
    await pair.main.router.shutdown()


async def test_a_failed_request_is_recorded_as_failed_in_main() -> None:
    pair = await started(Pair(config("a")), "a")
    with pytest.raises(RuntimeError, match="upstream broke"):
        async with pair.lease("a"):
            raise RuntimeError("upstream broke")
    await pair.settle()
    assert [r.error for r in pair.main.records] == ["upstream broke"]
    assert pair.main.router.snapshot().in_flight == {}
    await pair.main.router.shutdown()


async def test_a_request_that_needs_a_swap_waits_in_mains_queue_and_is_granted_after() -> None:
    # One model of the group at a time: b waits until a's request ends, then loads.
    pair = await started(Pair(config("a", "b")), "a")
    order: list[str] = []
    loads: list[float] = []
    first_in = asyncio.Event()
    release_first = asyncio.Event()

    async def first() -> None:
        async with pair.lease("a"):
            first_in.set()
            await release_first.wait()
            order.append("first")

    async def second() -> None:
        async with pair.lease("b", AcquireOptions(on_granted=loads.append)) as lease:
            order.append("second")
            assert lease.config.id == "b"

    one = asyncio.create_task(first())
    await first_in.wait()
    two = asyncio.create_task(second())
    await pair.settle()
    assert pair.main.router.snapshot().waiting == {"b": 1} and order == []
    release_first.set()
    await asyncio.gather(one, two)
    assert order == ["first", "second"] and len(loads) == 1 and loads[0] >= 0
    await pair.settle()
    assert pair.main.router.snapshot().in_flight == {} and len(pair.grants) == 0
    await pair.main.router.shutdown()


async def test_a_request_main_refuses_raises_the_schedulers_own_status_and_code() -> None:
    pair = await started(Pair(config("a")), "a")
    pair.cfg.models["ghost"] = pair.cfg.models["a"].__class__(id="ghost", cmd=("serve", "ghost"))
    with pytest.raises(Refused) as refused:
        async with pair.lease("ghost"):
            pass
    assert refused.value.status == 404 and refused.value.code == "not_found"
    assert refused.value.message == "no local server found for requested model"
    await pair.settle()
    assert pair.listed.entries == {} and len(pair.grants) == 0 and len(pair.leases) == 0
    await pair.main.router.shutdown()


async def test_a_client_gone_while_queued_leaves_mains_queue_and_the_next_request_is_served() -> None:
    pair = await started(Pair(config("a", "b")), "a")
    held, waiting = await a_held_and_b_waiting(pair)
    waiting.cancel()  # the client hung up
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await pair.settle()
    assert pair.main.router.snapshot().waiting == {} and len(pair.grants) == 1
    await held.__aexit__(None, None, None)
    async with pair.lease("a"):
        assert pair.main.router.snapshot().in_flight == {"a": 1}
    await pair.settle()
    assert pair.main.router.snapshot().in_flight == {} and pair.listed.entries == {}
    await pair.main.router.shutdown()


async def test_mains_in_flight_cancel_runs_the_workers_cancel_and_the_next_request_is_served() -> None:
    pair = await started(Pair(config("a", "b")), "a")
    serving = asyncio.Event()

    async def slow() -> str:
        task = asyncio.current_task()
        assert task is not None
        try:
            async with pair.lease("a", on_cancel=task.cancel):
                serving.set()
                await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "ended cleanly"  # what the front answers its client
        return "whole"

    running = asyncio.create_task(slow())
    await serving.wait()
    next_one = pair.lease("b")
    queued = asyncio.create_task(next_one.__aenter__())
    await pair.settle()
    assert pair.main.router.snapshot().waiting == {"b": 1}
    pair.listed.entries[1][2].cancel()  # POST /api/inflight/1/cancel in main
    assert await running == "ended cleanly"
    lease = await queued  # the request queued behind it is served right after
    assert lease.config.id == "b"
    await pair.settle()
    assert pair.main.router.snapshot().in_flight == {"b": 1}
    await next_one.__aexit__(None, None, None)
    await pair.settle()
    assert pair.main.router.snapshot().in_flight == {} and pair.listed.entries == {}
    assert [(r.model, r.error) for r in pair.main.records] == [("a", "CancelledError"), ("b", None)]
    await pair.main.router.shutdown()


async def test_a_lease_main_preempts_raises_preempted_in_the_worker() -> None:
    pair = await started(Pair(config("bg", "chat", preempt_below=0)), "bg")
    serving = asyncio.Event()

    async def background() -> None:
        async with pair.lease("bg", AcquireOptions(priority=TASK)):
            serving.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(background())
    await serving.wait()
    async with pair.main.dispatcher.lease("chat", AcquireOptions(priority=0), origin="http") as lease:
        assert lease.process.id == "chat"
    with pytest.raises(Preempted, match="preemptBelow"):
        await task
    assert not task.cancelled()
    await pair.settle()
    assert pair.main.router.snapshot().in_flight == {} and pair.main.process("bg").in_flight == 0
    assert pair.listed.entries == {} and len(pair.grants) == 0
    await pair.main.router.shutdown()


async def test_a_worker_that_goes_away_ends_everything_it_held_or_asked_in_main() -> None:
    pair = await started(Pair(config("a", "b")), "a")
    _held, waiting = await a_held_and_b_waiting(pair)  # kept referenced: a lease let go would end
    assert pair.main.router.snapshot().in_flight == {"a": 1}
    assert pair.leases.channel is not None
    pair.leases.channel.close()  # the worker died
    with pytest.raises(MainGone):
        await waiting
    await pair.settle()
    assert pair.main.router.snapshot().in_flight == {} and pair.main.router.snapshot().waiting == {}
    assert pair.listed.entries == {} and len(pair.grants) == 0
    await pair.main.router.shutdown()
