"""Shared pieces for the process tests: demo-backed model configs, an event recorder, liveness checks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import psutil
import pytest

from llmswap.config.model import ModelConfig
from llmswap.process import LogRing, Process, ProcessEvent, shutdown_all
from tests.helpers.models import WITHIN
from tests.helpers.wait import until


class EventRecorder:
    """The `on_event` callback of a Process under test: keeps every event, lets a test wait for one."""

    def __init__(self) -> None:
        self.events: list[ProcessEvent] = []
        self._changed = asyncio.Event()

    def __call__(self, event: ProcessEvent) -> None:
        self.events.append(event)
        self._changed.set()

    def kinds(self) -> list[str]:
        return [event.kind for event in self.events]

    def of(self, kind: str) -> list[ProcessEvent]:
        return [event for event in self.events if event.kind == kind]

    async def wait_for(self, kind: str, *, count: int = 1, within: float = WITHIN) -> ProcessEvent:
        """The `count`-th event of `kind`, waiting for it if it has not happened yet."""
        async with asyncio.timeout(within):
            while len(self.of(kind)) < count:
                self._changed.clear()
                await self._changed.wait()
        return self.of(kind)[count - 1]


def is_gone(pid: int) -> bool:
    """No such process, or only a zombie waiting for a reaper that is not us."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def poll_until(condition: Callable[[], bool], within: float = WITHIN, interval: float = 0.01) -> None:
    """For state outside our event loop (another process's liveness), where no event can be awaited."""
    await until(condition, within=within, interval=interval)


async def wait_gone(pid: int, within: float = WITHIN) -> None:
    await poll_until(lambda: is_gone(pid), within)


async def wait_for_line(ring: LogRing, text: str, within: float = WITHIN) -> str:
    """The first line of `ring` containing `text`, waiting for it to be appended."""
    async with asyncio.timeout(within), ring.subscribe() as lines:
        for line in ring.history():
            if text in line:
                return line
        async for line in lines:
            if text in line:
                return line
    raise AssertionError(f"{text!r} never appeared in the {ring.name} log")


async def spawned_pid(process: Process, within: float = WITHIN) -> int:
    """The pid of the child a start is spawning, once it exists."""
    await poll_until(lambda: process.pid is not None, within, interval=0.005)
    assert process.pid is not None
    return process.pid


MakeProcess = Callable[..., tuple[Process, EventRecorder]]


@pytest.fixture
async def make_process() -> AsyncIterator[MakeProcess]:
    """Build Processes that record their events; every one of them is shut down after the test."""
    made: list[Process] = []

    def make(config: ModelConfig, **kwargs: Any) -> tuple[Process, EventRecorder]:
        recorder = EventRecorder()
        process = Process(config, on_event=recorder, **kwargs)
        made.append(process)
        return process, recorder

    yield make
    await shutdown_all(made, timeout=0.5)
    left = [child for child in psutil.Process().children(recursive=True) if not is_gone(child.pid)]
    leaked = [child for child in left if _is_demo(child)]
    assert not leaked, f"upstream processes left running after shutdown: {leaked}"


def _is_demo(process: psutil.Process) -> bool:
    try:
        return "llmswap.demo" in " ".join(process.cmdline())
    except psutil.Error:
        return False
