"""Starting an upstream: ready, one shared start, aborts, restarts after a stop, shutdown."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from llmswap.process import ProcessState, StartAborted, shutdown_all
from tests.helpers.models import demo_config
from tests.integration.process.conftest import MakeProcess, wait_for_line, wait_gone


async def test_start_makes_the_upstream_ready_and_answering(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config("alpha", "--startup-delay", "0.2"))
    assert process.state is ProcessState.STOPPED

    await process.ensure_ready()

    assert process.state is ProcessState.READY
    assert process.pid is not None
    assert process.last_start_duration is not None and process.last_start_duration > 0
    assert events.kinds() == ["starting", "ready"]
    assert events.of("ready")[0].duration == process.last_start_duration
    assert "listening on" in await wait_for_line(process.logs, "llmswap-demo: listening on")
    url = f"{process.config.proxy}/v1/models"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        assert response.headers["X-Demo-Model"] == "alpha"


async def test_ready_is_a_no_op_once_ready(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config())
    await process.ensure_ready()
    pid = process.pid
    await process.ensure_ready()
    assert process.pid == pid
    assert events.kinds() == ["starting", "ready"]


async def test_concurrent_ensure_ready_share_one_spawn(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config("shared", "--startup-delay", "0.3"))

    await asyncio.gather(*(process.ensure_ready() for _ in range(8)))

    assert events.kinds() == ["starting", "ready"]
    listening = [line for line in process.logs.history() if "listening on" in line]
    assert len(listening) == 1, process.logs.history()


async def test_a_cancelled_caller_does_not_cancel_the_shared_start(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config("patient", "--startup-delay", "0.3"))
    gone = asyncio.create_task(process.ensure_ready())
    await events.wait_for("starting")
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone

    await process.ensure_ready()

    assert events.kinds() == ["starting", "ready"]


async def test_stop_during_start_aborts_it_and_kills_the_child(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config("aborted", "--never-healthy"))
    starters = [asyncio.create_task(process.ensure_ready()) for _ in range(3)]
    await wait_for_line(process.logs, "listening on")  # the child is up, its health check still failing
    pid = process.pid
    assert pid is not None and process.state is ProcessState.STARTING

    await process.stop()

    results = await asyncio.gather(*starters, return_exceptions=True)
    assert all(isinstance(result, StartAborted) for result in results), results
    assert all(str(result) == "start aborted" for result in results)
    assert process.state is ProcessState.STOPPED
    assert process.pid is None
    assert events.kinds() == ["starting", "stopping", "stopped"]
    assert events.of("stopped")[0].detail == "start aborted"
    await wait_gone(pid)


async def test_stop_is_a_no_op_when_stopped(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config())
    await process.stop()
    await process.ensure_ready()
    await process.stop()
    await process.stop()
    assert process.state is ProcessState.STOPPED
    assert events.kinds() == ["starting", "ready", "stopping", "stopped"]


async def test_ensure_ready_during_stopping_waits_then_starts_fresh(make_process: MakeProcess) -> None:
    # The child ignores SIGTERM, so the stop takes its whole grace period: a long, observable "stopping".
    process, events = make_process(demo_config("slowstop", "--ignore-sigterm", unload_timeout=0.5))
    await process.ensure_ready()
    first_pid = process.pid
    stopping = asyncio.create_task(process.stop())
    await events.wait_for("stopping")
    assert process.state is ProcessState.STOPPING

    await process.ensure_ready()

    assert stopping.done()
    assert process.state is ProcessState.READY
    assert process.pid != first_pid
    assert events.kinds() == ["starting", "ready", "stopping", "stopped", "starting", "ready"]
    assert first_pid is not None
    await wait_gone(first_pid)


async def test_shutdown_all_leaves_nothing_running_and_refuses_new_starts(make_process: MakeProcess) -> None:
    ready, _ = make_process(demo_config("ready"))
    starting, _ = make_process(demo_config("starting", "--never-healthy"))
    await ready.ensure_ready()
    pending = asyncio.create_task(starting.ensure_ready())
    await wait_for_line(starting.logs, "listening on")
    pids = [ready.pid, starting.pid]

    await shutdown_all([ready, starting], timeout=0.5)

    assert ready.state is ProcessState.SHUTDOWN and starting.state is ProcessState.SHUTDOWN
    with pytest.raises(StartAborted):
        await pending
    with pytest.raises(StartAborted, match="shut down"):
        await ready.ensure_ready()
    for pid in pids:
        assert pid is not None
        await wait_gone(pid)


async def test_check_endpoint_none_is_ready_once_spawned(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config("unchecked", "--never-healthy", check_endpoint="none"))
    await process.ensure_ready()
    assert process.state is ProcessState.READY
    assert events.kinds() == ["starting", "ready"]


async def test_output_goes_to_the_model_ring_and_the_mirror(make_process: MakeProcess) -> None:
    from llmswap.process import LogRing

    upstream = LogRing("upstream")
    process, _ = make_process(demo_config("mirrored"), mirror=upstream)
    await process.ensure_ready()
    line = await wait_for_line(process.logs, "listening on")
    assert line in await wait_for_line(upstream, "listening on")
