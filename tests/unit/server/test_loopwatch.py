"""llmswap's loop watch (`llmswap.server.loopwatch`): a callback that blocks in a system call is named for
its wall-clock time, one that computes for its own CPU time, short ones not at all; uninstalled, the loop's
callbacks run as asyncio made them."""

from __future__ import annotations

import asyncio
import time

import pytest

from llmswap.server.loopwatch import LoopWatch

BOUND = 0.05


def compute(seconds: float) -> None:
    """Hold the thread for `seconds` of its own CPU time, whatever else the machine runs."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


async def test_a_blocking_call_and_a_long_computation_are_named_and_short_callbacks_are_not() -> None:
    caught: list[str] = []
    watch = LoopWatch(BOUND, caught.append)
    loop = asyncio.get_running_loop()
    watch.install()
    try:
        loop.call_soon(time.sleep, BOUND * 2)
        await asyncio.sleep(0)
        await asyncio.create_task(asyncio.to_thread(time.sleep, BOUND * 2))  # waits off the loop: fine
        loop.call_soon(compute, BOUND * 2)
        await asyncio.sleep(0)

        async def quick() -> None:
            for _ in range(100):
                await asyncio.sleep(0)

        await asyncio.create_task(quick(), name="quick")
    finally:
        watch.uninstall()
    assert len(caught) == 2, caught
    assert "sleep" in caught[0] and "blocking in a system call" in caught[0]
    assert "compute" in caught[1] and "computing" in caught[1]


async def test_a_task_step_is_named_by_its_task_and_its_coroutine() -> None:
    caught: list[str] = []
    watch = LoopWatch(BOUND, caught.append)

    async def holds_the_loop() -> None:
        compute(BOUND * 2)

    watch.install()
    try:
        await asyncio.create_task(holds_the_loop(), name="busy")
    finally:
        watch.uninstall()
    assert len(caught) == 1 and caught[0].startswith("task 'busy' (")
    assert "holds_the_loop" in caught[0]


def test_one_watch_at_a_time_and_uninstalling_restores_the_loop() -> None:
    original = vars(asyncio.Handle)["_run"]
    first = LoopWatch(BOUND, print)
    first.install()
    try:
        with pytest.raises(RuntimeError):
            LoopWatch(BOUND, print).install()
    finally:
        first.uninstall()
    assert vars(asyncio.Handle)["_run"] is original
