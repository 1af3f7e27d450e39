"""A `Process` whose server can sleep, driven directly: the sleep and the wake keep the pid, and a sleep or
wake asked of a life that is ending answers False instead of waiting forever (the races made deterministic
by asking in the same step as the stop)."""

from __future__ import annotations

import asyncio

from llmswap.process import ProcessState
from tests.helpers.models import demo_config
from tests.integration.process.conftest import MakeProcess

CALLS = {"sleep_call": ("POST", "/sleep?level=1"), "wake_call": ("POST", "/wake_up")}


async def test_sleep_and_wake_keep_the_process(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config("s", "--enable-sleep-mode", **CALLS))
    await process.ensure_ready()
    pid = process.pid
    assert await process.sleep() is True
    assert process.state is ProcessState.SLEEPING and process.pid == pid
    await process.ensure_ready()
    assert process.state is ProcessState.READY and process.pid == pid
    assert [e.kind for e in events.events if e.kind in ("slept", "woke")] == ["slept", "woke"]


async def test_a_sleep_asked_as_a_stop_begins_answers_false_and_the_process_stops(
        make_process: MakeProcess) -> None:
    process, _ = make_process(demo_config("s", "--enable-sleep-mode", **CALLS))
    await process.ensure_ready()
    stopping = asyncio.ensure_future(process.stop())
    await asyncio.sleep(0)  # the stop is requested: the supervisor will not serve the sleep
    assert await asyncio.wait_for(process.sleep(), 10) is False
    await stopping
    assert process.state is ProcessState.STOPPED


async def test_a_wake_asked_as_the_sleeping_server_is_stopped_starts_it_fresh(
        make_process: MakeProcess) -> None:
    process, _ = make_process(demo_config("s", "--enable-sleep-mode", **CALLS))
    await process.ensure_ready()
    first = process.pid
    assert await process.sleep() is True
    stopping = asyncio.ensure_future(process.stop())
    await asyncio.sleep(0)
    await asyncio.wait_for(process.ensure_ready(), 20)  # not woken: started again after the stop
    await stopping
    assert process.state is ProcessState.READY and process.pid != first
