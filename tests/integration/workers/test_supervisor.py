"""The supervisor with real worker processes (small Python scripts): started, restarted with the backoff when
they die, stopped with SIGTERM and the grace's SIGKILL (after they had time to leave by themselves, when
asked), serving a listening socket they inherited."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from llmswap.workers.supervisor import (
    Supervisor,
    WorkerEvent,
    WorkerExited,
    WorkerFailedToStart,
    WorkerSpec,
    WorkerStarted,
)
from tests.helpers.wait import eventually

SCRIPT = str(Path(__file__).with_name("supervised_worker.py"))
TINY = {"backoff": 0.01, "max_backoff": 0.04, "stable_after": 60.0}


class Events:
    """The observer under test: keeps every event, lets a test wait for the ones it expects."""

    def __init__(self) -> None:
        self.seen: list[WorkerEvent] = []
        self._changed = asyncio.Event()

    def __call__(self, event: WorkerEvent) -> None:
        self.seen.append(event)
        self._changed.set()

    def of(self, kind: type) -> list[WorkerEvent]:
        return [event for event in self.seen if isinstance(event, kind)]

    async def wait(self, match: Callable[[WorkerEvent], bool], count: int = 1) -> list[WorkerEvent]:
        """The first `count` events `match` accepts, waiting until there are that many."""
        async with asyncio.timeout(10):
            while len(found := [event for event in self.seen if match(event)]) < count:
                self._changed.clear()
                await self._changed.wait()
        return found[:count]


def ready_pids(folder: Path) -> list[int]:
    """The pids of the workers that told `folder` they are set up (READY_DIR of supervised_worker.py)."""
    return [int(ready.name.split("-")[1]) for ready in folder.iterdir()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


Supervise = Callable[..., tuple[Supervisor, Events]]


@pytest.fixture
async def supervise() -> AsyncIterator[Supervise]:
    """Make a supervisor reporting to an `Events`; every one made is stopped at the end of the test."""
    made: list[Supervisor] = []

    def make(argv: list[str], *, listener: socket.socket | None = None, env: dict[str, str] | None = None,
             **backoff: float) -> tuple[Supervisor, Events]:
        events = Events()
        supervisor = Supervisor(WorkerSpec(argv, env or {}, listener), events, **{**TINY, **backoff})
        made.append(supervisor)
        return supervisor, events

    yield make
    for supervisor in made:
        await supervisor.stop(0)


async def test_a_killed_worker_is_started_again_and_the_others_are_left_alone(supervise: Supervise) -> None:
    supervisor, events = supervise([sys.executable, SCRIPT, "sleep"])
    await supervisor.start(2)
    first = await events.wait(lambda event: isinstance(event, WorkerStarted), 2)
    assert sorted(event.index for event in first) == [0, 1]
    pids = supervisor.pids
    assert sorted(pids) == sorted(event.pid for event in first) and all(alive(pid) for pid in pids)

    os.kill(pids[0], signal.SIGKILL)

    [exited] = await events.wait(lambda event: isinstance(event, WorkerExited))
    assert exited == WorkerExited(0, pids[0], -signal.SIGKILL, restarting=True, delay=0.01)
    [again] = await events.wait(lambda event: isinstance(event, WorkerStarted) and event.pid != pids[0]
                                and event.pid != pids[1])
    assert again.index == 0 and alive(again.pid)
    assert supervisor.pids == [again.pid, pids[1]]  # the other worker kept running throughout

    await supervisor.stop(5)

    stopped = {(event.index, event.pid, event.returncode, event.restarting)
               for event in events.of(WorkerExited)[1:]}
    assert stopped == {(0, again.pid, -signal.SIGTERM, False), (1, pids[1], -signal.SIGTERM, False)}
    assert supervisor.pids == [None, None] and not alive(again.pid) and not alive(pids[1])


async def test_restarts_back_off_doubling_up_to_the_most(supervise: Supervise) -> None:
    supervisor, events = supervise([sys.executable, SCRIPT, "exit", "3"])
    await supervisor.start(1)

    exits = await events.wait(lambda event: isinstance(event, WorkerExited), 5)

    assert [(event.returncode, event.restarting, event.delay) for event in exits] == [
        (3, True, 0.01), (3, True, 0.02), (3, True, 0.04), (3, True, 0.04), (3, True, 0.04)]
    assert len({event.pid for event in exits}) == 5


async def test_the_backoff_starts_over_after_a_run_that_lasted(supervise: Supervise) -> None:
    supervisor, events = supervise([sys.executable, SCRIPT, "exit", "0"], stable_after=0.0)  # every run lasts
    await supervisor.start(1)

    exits = await events.wait(lambda event: isinstance(event, WorkerExited), 4)

    assert [(event.returncode, event.restarting, event.delay) for event in exits] == [(0, True, 0.01)] * 4


async def test_stop_kills_the_worker_that_ignores_sigterm_once_the_grace_is_over(
        supervise: Supervise, tmp_path: Path) -> None:
    supervisor, events = supervise([sys.executable, SCRIPT, "sleep"],
                                   env={"IGNORE_TERM": "1", "READY_DIR": str(tmp_path)})
    await supervisor.start(2)

    async def both_set_up() -> bool:
        return len(ready_pids(tmp_path)) == 2
    await eventually(both_set_up, what="both workers setting up their signals")

    await supervisor.stop(0.2)

    stopped = sorted((event.index, event.returncode, event.restarting) for event in events.of(WorkerExited))
    assert stopped == [(0, -signal.SIGTERM, False), (1, -signal.SIGKILL, False)]
    assert supervisor.pids == [None, None]
    assert not any(alive(pid) for pid in ready_pids(tmp_path))


async def test_a_stop_lets_workers_leave_by_themselves_first_and_signals_only_the_one_that_stays(
        supervise: Supervise, tmp_path: Path) -> None:
    leave = tmp_path / "leave"
    supervisor, events = supervise([sys.executable, SCRIPT, "leave-on", str(leave)],
                                   env={"STAY": "1", "READY_DIR": str(tmp_path)})
    await supervisor.start(2)

    async def both_set_up() -> bool:
        return len(ready_pids(tmp_path)) == 2
    await eventually(both_set_up, what="both workers running")

    stopping = asyncio.create_task(supervisor.stop(5, leaving=0.5))
    await asyncio.sleep(0)  # the stop began: an exit from now on is not restarted
    leave.touch()  # what a retiring worker's channel tells it
    await stopping

    stopped = sorted((event.index, event.returncode, event.restarting) for event in events.of(WorkerExited))
    assert stopped == [(0, 0, False), (1, -signal.SIGTERM, False)], "0 left by itself; 1 got SIGTERM"
    assert len(events.of(WorkerStarted)) == 2 and supervisor.pids == [None, None]


async def test_a_worker_that_exits_once_restarts_stopped_stays_down(supervise: Supervise,
                                                                    tmp_path: Path) -> None:
    leave = tmp_path / "leave"
    supervisor, events = supervise([sys.executable, SCRIPT, "leave-on", str(leave)],
                                   env={"READY_DIR": str(tmp_path)})
    await supervisor.start(1)

    async def set_up() -> bool:
        return len(ready_pids(tmp_path)) == 1
    await eventually(set_up, what="the worker running")

    supervisor.stop_restarting()  # a reload retired it: it leaves when its channel ends
    leave.touch()
    [exited] = await events.wait(lambda event: isinstance(event, WorkerExited))

    assert (exited.returncode, exited.restarting) == (0, False)
    await asyncio.wait_for(supervisor.stop(5), 5)
    assert len(events.of(WorkerStarted)) == 1 and supervisor.pids == [None]


async def test_a_stop_whose_caller_is_cancelled_goes_on_and_a_second_call_waits_for_it(
        supervise: Supervise) -> None:
    supervisor, events = supervise([sys.executable, SCRIPT, "sleep"])
    await supervisor.start(1)
    [started] = await events.wait(lambda event: isinstance(event, WorkerStarted))
    stopping = asyncio.create_task(supervisor.stop(5))
    await asyncio.sleep(0)

    stopping.cancel()  # a reload's task, cancelled by the server's stop
    await asyncio.wait_for(supervisor.stop(5), 5)

    [exited] = events.of(WorkerExited)
    assert (exited.pid, exited.returncode, exited.restarting) == (started.pid, -signal.SIGTERM, False)
    assert supervisor.pids == [None] and not alive(started.pid)


async def test_workers_accept_on_the_listening_socket_they_inherit(supervise: Supervise) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    supervisor, _ = supervise([sys.executable, SCRIPT, "accept"], listener=listener)
    await supervisor.start(2)

    got = []
    for _ in range(2):  # each worker accepts exactly one connection
        reader, writer = await asyncio.open_connection(*listener.getsockname())
        got.append(await reader.read())
        writer.close()

    assert sorted(got) == [b"0", b"1"]
    listener.close()


async def test_a_worker_that_cannot_be_started_is_retried_with_the_backoff(supervise: Supervise) -> None:
    supervisor, events = supervise(["/nonexistent/llmswap-worker"])
    await supervisor.start(1)  # returns after the first attempt, failed or not

    failures = await events.wait(lambda event: isinstance(event, WorkerFailedToStart), 3)

    assert [(event.index, event.restarting, event.delay) for event in failures] == [
        (0, True, 0.01), (0, True, 0.02), (0, True, 0.04)]
    assert "No such file" in failures[0].error
    assert supervisor.pids == [None]


async def test_stop_does_not_wait_out_a_restart_backoff(supervise: Supervise) -> None:
    supervisor, events = supervise([sys.executable, SCRIPT, "exit", "3"], backoff=300.0, max_backoff=300.0)
    await supervisor.start(1)
    await events.wait(lambda event: isinstance(event, WorkerExited))

    await asyncio.wait_for(supervisor.stop(5), 5)  # far less than the 300 s backoff

    assert len(events.of(WorkerStarted)) == 1
