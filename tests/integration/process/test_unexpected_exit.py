"""A ready upstream dying by itself: noticed at once, reported, and started again on the next request."""

from __future__ import annotations

import asyncio
import os
import signal

import aiohttp
import pytest

from llmswap.process import ProcessState
from tests.helpers.models import demo_config
from tests.integration.process.conftest import MakeProcess, is_gone, wait_for_line, wait_gone


async def test_unexpected_exit_stops_the_process_and_the_next_start_works(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config("fragile", "--log-requests"))
    await process.ensure_ready()
    first_pid = process.pid
    assert first_pid is not None
    async with aiohttp.ClientSession() as session, session.get(f"{process.config.proxy}/v1/models") as reply:
        assert reply.status == 200
    request_line = await wait_for_line(process.logs, "/v1/models")

    os.kill(first_pid, signal.SIGKILL)  # a crash, as far as the process machinery can tell

    exited = await events.wait_for("exited")
    assert exited.exit_code == -signal.SIGKILL
    assert exited.detail.startswith("upstream process exited unexpectedly (exit code -9, killed by SIGKILL)")
    assert request_line in exited.detail  # the last lines of its output come with it
    assert process.state is ProcessState.STOPPED
    assert process.pid is None
    assert events.kinds() == ["starting", "ready", "exited"]

    await process.ensure_ready()

    assert process.state is ProcessState.READY
    assert process.pid not in (None, first_pid)
    assert events.kinds() == ["starting", "ready", "exited", "starting", "ready"]


async def test_a_crash_takes_the_upstream_grandchildren_along(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config("crashing", "--spawn-grandchild"))
    await process.ensure_ready()
    grandchild = int((await wait_for_line(process.logs, "grandchild pid=")).rsplit("=", 1)[1])
    assert process.pid is not None and not is_gone(grandchild)

    os.kill(process.pid, signal.SIGKILL)

    await events.wait_for("exited")
    await wait_gone(grandchild)


async def test_stop_after_an_unexpected_exit_is_a_no_op(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config("gone"))
    await process.ensure_ready()
    assert process.pid is not None
    os.kill(process.pid, signal.SIGTERM)
    await events.wait_for("exited")
    await asyncio.wait_for(process.stop(), 15.0)
    assert events.kinds() == ["starting", "ready", "exited"]


async def test_exit_is_noticed_without_pidfd_too(
    make_process: MakeProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Kernels before 5.3 (or sandboxes refusing pidfd_open) get a waiting thread instead.
    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    process, events = make_process(demo_config("threaded"))
    await process.ensure_ready()
    assert process.pid is not None
    os.kill(process.pid, signal.SIGKILL)
    assert (await events.wait_for("exited")).exit_code == -signal.SIGKILL
    await process.ensure_ready()
    await process.stop()
    assert events.of("stopped")[0].exit_code == 0
