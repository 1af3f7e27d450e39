"""Unloading idle models after `ttl` seconds: from the last request's end, or from ready if never used."""

from __future__ import annotations

import asyncio
import time

from llmswap.process import ProcessState
from tests.helpers.models import demo_config
from tests.integration.process.conftest import MakeProcess, wait_gone

TTL = 0.3


async def test_ttl_unloads_an_idle_model_after_its_last_request(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config("idle", ttl=TTL))
    await process.ensure_ready()
    pid = process.pid
    process.request_started()
    process.request_ended()
    released = time.monotonic()

    expired = await events.wait_for("ttl_expired")
    expired_at = time.monotonic()
    await events.wait_for("stopped")

    assert expired_at - released >= TTL  # a lower bound only: it may come later on a loaded machine
    assert expired.detail == "idle for 300ms (ttl)"
    assert events.kinds() == ["starting", "ready", "ttl_expired", "stopping", "stopped"]
    assert events.of("stopped")[0].detail == "ttl expired"
    assert process.state is ProcessState.STOPPED
    assert pid is not None
    await wait_gone(pid)


async def test_ttl_unloads_a_model_never_used_after_its_start(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config("unused", ttl=TTL))
    await process.ensure_ready()
    await events.wait_for("ttl_expired")
    await events.wait_for("stopped")
    assert process.state is ProcessState.STOPPED


async def test_ttl_is_held_while_a_request_is_in_flight(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config("busy", ttl=0.2))
    await process.ensure_ready()

    process.request_started()
    await asyncio.sleep(1.0)  # five TTLs: long enough to expire, were it not for the request
    assert "ttl_expired" not in events.kinds()
    assert process.state is ProcessState.READY
    assert process.in_flight == 1
    process.request_ended()
    released = time.monotonic()

    await events.wait_for("ttl_expired")
    assert time.monotonic() - released >= 0.2
    await events.wait_for("stopped")


async def test_a_request_after_a_ttl_unload_starts_the_model_again(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config("revived", ttl=TTL))
    await process.ensure_ready()
    await events.wait_for("stopped")
    await process.ensure_ready()
    assert process.state is ProcessState.READY
    assert events.kinds()[-2:] == ["starting", "ready"]


async def test_no_ttl_keeps_the_model(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config("kept", ttl=0))
    await process.ensure_ready()
    await asyncio.sleep(0.5)
    assert events.kinds() == ["starting", "ready"]
