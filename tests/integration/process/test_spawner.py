"""Children are forked on the spawner's thread: the event loop goes on while one starts, and a start whose
caller was cancelled meanwhile leaves no child behind."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from llmswap.process import child as child_module
from llmswap.process.child import spawn_child
from tests.integration.process.conftest import WITHIN, poll_until, wait_gone

SLOW_START = 0.5  # seconds the child spends between fork and exec (its preexec function sleeps)


@pytest.fixture
def slow_fork(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every child spends SLOW_START between fork and exec; returns the threads that forked them."""
    forked_on: list[str] = []
    real = child_module.parent_death_signal

    def slow() -> Callable[[], None] | None:
        forked_on.append(threading.current_thread().name)
        armed = real()

        def preexec() -> None:
            time.sleep(SLOW_START)
            if armed is not None:
                armed()

        return preexec

    monkeypatch.setattr(child_module, "parent_death_signal", slow)
    return forked_on


def pid_writer(path: Path) -> list[str]:
    code = f"import os, time; open({str(path)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    return [sys.executable, "-c", code]


async def test_the_loop_runs_on_while_a_child_starts(tmp_path: Path, slow_fork: list[str]) -> None:
    pid_file = tmp_path / "pid"
    starting = asyncio.create_task(spawn_child(pid_writer(pid_file), env={}, on_line=lambda _: None,
                                               keeper=False))
    await asyncio.sleep(0.05)  # the loop's own timer: it fires while the child is still between fork and exec
    assert not starting.done()
    child = await asyncio.wait_for(starting, WITHIN)
    try:
        assert slow_fork and all(name.startswith("llmswap-spawner") for name in slow_fork)
        assert slow_fork[0] != threading.current_thread().name
    finally:
        child.signal_group(9)
        await child.wait_exit(WITHIN)
        await child.close(0.1)


async def test_a_start_cancelled_while_the_child_forks_leaves_no_child(
    tmp_path: Path, slow_fork: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[int] = []  # the pids the spawner's thread started (the child, then its keeper)
    real = child_module._popen

    def popen(*args: Any) -> Any:
        spawned, keeper = real(*args)
        started.append(spawned.pid)
        return spawned, keeper

    monkeypatch.setattr(child_module, "_popen", popen)
    starting = asyncio.create_task(spawn_child(pid_writer(tmp_path / "pid"), env={}, on_line=lambda _: None))
    await asyncio.sleep(0.05)
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    # The fork had happened: the child starts anyway, and is killed and reaped as soon as it has.
    await poll_until(lambda: bool(started), WITHIN)
    await wait_gone(started[0])
    assert started[0] not in {process.pid for process in psutil.Process().children(recursive=True)}
