"""Config reload at the router level: a successor adopts unchanged processes while the old router drains.

Fake processes (tests/helpers/fake_process.py) keep these fast and deterministic; the CLI integration
tests do the same with real demo upstreams.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import pytest

from llmswap.config.model import Config, GroupConfig, ModelConfig, RouterConfig, RoutingConfig
from llmswap.process.state import ProcessState
from llmswap.router import AcquireOptions, build_router
from llmswap.router.handover import adoptable, same_model, successor_router
from llmswap.router.router import Router
from llmswap.scheduler.errors import ConcurrencyLimit
from tests.helpers import wait
from tests.helpers.fake_process import FakeProcess, FakeScript, fake_factory

WITHIN = 10.0


def config(*models: ModelConfig, exclusive: bool = True) -> Config:
    ids = tuple(sorted(m.id for m in models))
    groups = {"(default)": GroupConfig("(default)", swap=exclusive, exclusive=exclusive, members=ids)}
    return Config(models={m.id: m for m in models},
                  routing=RoutingConfig(router=RouterConfig(use="group", groups=groups)))


def model(mid: str, **overrides: object) -> ModelConfig:
    return dataclasses.replace(ModelConfig(id=mid, cmd=("serve", mid)), **overrides)


def start(cfg: Config, script: FakeScript) -> Router:
    router = build_router(cfg, process_factory=fake_factory(script))
    router.start()
    return router


def reload(old: Router, cfg: Config, script: FakeScript) -> Router:
    new = successor_router(old, cfg, process_factory=fake_factory(script))
    new.start()
    return new


async def until(predicate: Callable[[], bool], within: float = WITHIN) -> None:
    """Poll the router's own state (in-process, cheap) every millisecond."""
    await wait.until(predicate, within=within, interval=0.001)


async def hold(router: Router, mid: str, release: asyncio.Event, got: list[object]) -> None:
    async with router.acquire(mid) as process:
        got.append(process)
        await release.wait()


async def serve(router: Router, mid: str) -> object:
    async with router.acquire(mid) as process:
        assert process.state is ProcessState.READY
        return process


async def finish(*routers: Router) -> None:
    for router in reversed(routers):
        if not router.closing:
            await router.shutdown(1.0)


# ---------------------------------------------------------------------------------------------- pure


def test_same_model_ignores_the_line_it_was_declared_on() -> None:
    assert same_model(model("a", line=3), model("a", line=30))
    assert not same_model(model("a"), model("a", ttl=60))
    assert not same_model(model("a"), model("a", cmd=("serve", "a", "--ctx", "8192")))


def test_adoptable_keeps_only_models_present_and_unchanged() -> None:
    old = config(model("a"), model("b"), model("c"))
    new = config(model("a", line=9), model("b", proxy="http://127.0.0.1:9"), model("d"))
    assert adoptable(old, new) == frozenset({"a"})


# ---------------------------------------------------------------------------------------------- handover


async def test_reload_keeps_unchanged_process_and_shuts_down_changed_one() -> None:
    script = FakeScript()
    old = start(config(model("a"), model("b"), exclusive=False), script)
    a_before = await serve(old, "a")
    b_before = await serve(old, "b")
    new = reload(old, config(model("a"), model("b", ttl=30), exclusive=False), script)
    try:
        assert new.processes["a"] is a_before
        assert new.processes["a"].state is ProcessState.READY
        await until(lambda: b_before.state is ProcessState.SHUTDOWN)
        assert new.processes["b"] is not b_before
        assert await serve(new, "a") is a_before
        assert await serve(new, "b") is new.processes["b"]
        assert script.starts == {"a": 1, "b": 2}
        handover = new.handover_in
        if handover is not None:
            await handover.wait_done(WITHIN)
        assert new.handover_in is None
    finally:
        await finish(old, new)


async def test_removed_model_is_stopped_and_unknown_to_the_successor() -> None:
    script = FakeScript()
    old = start(config(model("a"), model("gone"), exclusive=False), script)
    gone = await serve(old, "gone")
    new = reload(old, config(model("a"), exclusive=False), script)
    try:
        await until(lambda: gone.state is ProcessState.SHUTDOWN)
        assert "gone" not in new.processes
        assert new.model_state("gone") is None
    finally:
        await finish(old, new)


async def test_adopted_model_is_not_evicted_while_the_old_router_still_serves_it() -> None:
    script = FakeScript()
    old = start(config(model("a"), model("b")), script)  # exclusive: b evicts a
    release = asyncio.Event()
    got: list[object] = []
    holder = asyncio.create_task(hold(old, "a", release, got))
    await until(lambda: bool(got))
    a = got[0]
    new = reload(old, config(model("a"), model("b"), model("c")), script)
    b_request = asyncio.create_task(serve(new, "b"))
    try:
        # The successor planned a swap to b evicting a; the eviction waits for the old router's response.
        await until(lambda: new.snapshot().loading == ("b",))
        await new.wait_idle()
        assert a.state is ProcessState.READY
        assert script.starts.get("b") is None
        assert not b_request.done()
        release.set()
        await holder
        assert await asyncio.wait_for(b_request, WITHIN) is new.processes["b"]
        assert a.state is ProcessState.STOPPED
    finally:
        release.set()
        await finish(old, new)


async def test_waiters_of_the_old_router_are_served_by_the_successor() -> None:
    script = FakeScript()
    old = start(config(model("a"), model("b")), script)
    release = asyncio.Event()
    got: list[object] = []
    holder = asyncio.create_task(hold(old, "a", release, got))
    await until(lambda: bool(got))
    queued = asyncio.create_task(serve(old, "b"))  # waits: b would evict a, which is serving
    await until(lambda: old.snapshot().waiting == {"b": 1})
    new = reload(old, config(model("a"), model("b")), script)
    try:
        await until(lambda: old.snapshot().waiting == {})
        assert not queued.done()
        release.set()
        await holder
        process = await asyncio.wait_for(queued, WITHIN)
        assert process is new.processes["b"]
        assert process is old.processes["b"]  # adopted: the same object under both routers
    finally:
        release.set()
        await finish(old, new)


async def test_loading_callback_fires_once_for_a_waiter_moved_to_the_successor() -> None:
    script = FakeScript(start_delay=lambda mid: 0.2 if mid == "b" else 0.0)
    old = start(config(model("a"), model("b")), script)
    release = asyncio.Event()
    got: list[object] = []
    holder = asyncio.create_task(hold(old, "a", release, got))
    await until(lambda: bool(got))
    admitted: list[ProcessState] = []

    async def wait_for_b() -> object:
        async with old.acquire("b", AcquireOptions(on_admitted=admitted.append)) as process:
            return process

    queued = asyncio.create_task(wait_for_b())
    await until(lambda: len(admitted) == 1)
    new = reload(old, config(model("a"), model("b")), script)
    try:
        release.set()
        await holder
        assert await asyncio.wait_for(queued, WITHIN) is new.processes["b"]
        assert len(admitted) == 1
    finally:
        release.set()
        await finish(old, new)


async def test_a_request_reaching_the_retired_router_goes_to_the_successor() -> None:
    script = FakeScript()
    old = start(config(model("a")), script)
    new = reload(old, config(model("a", ttl=5)), script)
    try:
        process = await serve(old, "a")
        assert process is new.processes["a"]
        assert old.processes["a"].state is ProcessState.SHUTDOWN
    finally:
        await finish(old, new)


async def test_successor_joins_a_load_the_old_router_started() -> None:
    script = FakeScript(start_delay=lambda mid: 0.2)
    old = start(config(model("a"), model("b")), script)
    loading = asyncio.create_task(serve(old, "a"))
    await until(lambda: old.snapshot().loading == ("a",))
    new = reload(old, config(model("a"), model("b"), model("c")), script)
    try:
        assert new.model_state("a") is ProcessState.STARTING
        assert await asyncio.wait_for(loading, WITHIN) is new.processes["a"]
        assert script.starts == {"a": 1}
    finally:
        await finish(old, new)


async def test_victim_of_the_old_routers_swap_looks_stopping_to_the_successor() -> None:
    script = FakeScript(stop_delay=0.2)
    old = start(config(model("a"), model("b")), script)
    await serve(old, "a")
    swapping = asyncio.create_task(serve(old, "b"))  # evicts a
    await until(lambda: old.snapshot().loading == ("b",))
    new = reload(old, config(model("a"), model("b"), model("c")), script)
    try:
        assert new.model_state("a") is ProcessState.STOPPING
        assert new.model_state("b") is ProcessState.STARTING
        assert await asyncio.wait_for(swapping, WITHIN) is new.processes["b"]
        assert new.processes["a"].state is ProcessState.STOPPED
    finally:
        await finish(old, new)


async def test_replacement_starts_only_after_the_old_process_is_gone() -> None:
    seen: list[tuple[str, ProcessState]] = []
    script = FakeScript(stop_delay=0.1, on_state=lambda mid, st: seen.append((mid, st)))
    old = start(config(model("a")), script)
    old_a = await serve(old, "a")
    new = reload(old, config(model("a", ttl=10)), script)
    try:
        await serve(new, "a")
        assert old_a.state is ProcessState.SHUTDOWN
        a_states = [st for mid, st in seen if mid == "a"]
        last_start = max(i for i, st in enumerate(a_states) if st is ProcessState.STARTING)
        # The old process went through its whole life, shutdown included, before the new one started.
        assert ProcessState.SHUTDOWN in a_states[:last_start]
    finally:
        await finish(old, new)


async def test_chained_reloads_still_protect_the_oldest_routers_response() -> None:
    script = FakeScript()
    first = start(config(model("a"), model("b")), script)
    release = asyncio.Event()
    got: list[object] = []
    holder = asyncio.create_task(hold(first, "a", release, got))
    await until(lambda: bool(got))
    second = reload(first, config(model("a"), model("b"), model("c")), script)
    third = reload(second, config(model("a"), model("b"), model("d")), script)
    b_request = asyncio.create_task(serve(third, "b"))
    try:
        await until(lambda: third.snapshot().loading == ("b",))
        await third.wait_idle()
        assert got[0].state is ProcessState.READY
        assert not b_request.done()
        release.set()
        await holder
        assert await asyncio.wait_for(b_request, WITHIN) is third.processes["b"]
        for router in (second, third):
            handover = router.handover_in
            if handover is not None:
                await handover.wait_done(WITHIN)
        assert third.handover_in is None
    finally:
        release.set()
        await finish(first, second, third)


async def test_process_events_of_adopted_processes_reach_the_successor() -> None:
    script = FakeScript()
    old = start(config(model("a"), model("b"), exclusive=False), script)
    a = await serve(old, "a")
    new = reload(old, config(model("a"), model("c"), exclusive=False), script)
    seen: list[object] = []
    new.add_observer(seen.append)
    try:
        assert isinstance(a, FakeProcess)
        await a.expire()  # a TTL stop behind both schedulers' backs
        assert any(getattr(e, "model", None) == "a" and getattr(e, "kind", "") == "stopped" for e in seen)
        await new.wait_idle()
        assert new.running_models() == {}
        assert await serve(new, "a") is a
        assert script.starts["a"] == 2
    finally:
        await finish(old, new)


async def test_observers_carry_over_to_the_successor() -> None:
    script = FakeScript()
    old = start(config(model("a")), script)
    seen: list[object] = []
    old.add_observer(seen.append)
    new = reload(old, config(model("a"), model("b")), script)
    try:
        await serve(new, "b")
        assert any(getattr(e, "model", None) == "b" for e in seen)
    finally:
        await finish(old, new)


async def test_concurrency_limit_counts_requests_the_old_router_still_serves() -> None:
    script = FakeScript()
    limited = model("a", concurrency_limit=1)
    old = start(config(limited), script)
    release = asyncio.Event()
    got: list[object] = []
    holder = asyncio.create_task(hold(old, "a", release, got))
    await until(lambda: bool(got))
    new = reload(old, config(limited), script)
    try:
        assert new.inherited_in_flight("a") == 1
        with pytest.raises(ConcurrencyLimit):
            await serve(new, "a")  # the one slot is still taken on the old router
        release.set()
        await holder
        await until(lambda: new.inherited_in_flight("a") == 0)
        assert await serve(new, "a") is got[0]  # the same adopted process
    finally:
        release.set()
        await finish(old, new)


async def test_learned_times_of_kept_models_carry_over_to_the_successor() -> None:
    script = FakeScript()
    old = start(config(model("a"), model("b")), script)
    new = None
    try:
        await serve(old, "a")
        await serve(old, "b")
        assert old.scheduler.times.observed("a") == (1, 1)
        new = reload(old, config(model("a"), model("b", ttl=60)), script)
        assert new.scheduler.times.observed("a") == (1, 1)
        assert new.scheduler.times.load("a") == old.scheduler.times.load("a")
        assert new.scheduler.times.observed("b") == (0, 0)  # changed: its new process is measured afresh
    finally:
        await finish(*(r for r in (old, new) if r is not None))


async def test_shutting_down_the_successor_ends_the_predecessor_too() -> None:
    script = FakeScript()
    old = start(config(model("a"), model("b"), exclusive=False), script)
    release = asyncio.Event()
    got: list[object] = []
    holder = asyncio.create_task(hold(old, "a", release, got))
    await until(lambda: bool(got))
    new = reload(old, config(model("a"), model("b"), exclusive=False), script)
    await new.shutdown(1.0)
    assert old.closing
    assert got[0].state is ProcessState.SHUTDOWN
    release.set()
    await holder


async def test_retiring_twice_is_refused() -> None:
    script = FakeScript()
    old = start(config(model("a")), script)
    new = reload(old, config(model("a")), script)
    try:
        with pytest.raises(RuntimeError):
            successor_router(old, config(model("a")), process_factory=fake_factory(script))
    finally:
        await finish(old, new)
