"""An in-memory stand-in for `llmswap.process.Process`, for router tests that need no real child.

It keeps the real contract where the router depends on it: one shared start for concurrent
`ensure_ready()` calls, `stop()` during a start aborts it, state transitions are reported through
`on_event` like the real process does. Start time and failures are scripted per test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from llmswap.config.model import ModelConfig
from llmswap.process.events import EventKind, LifeTimes, ProcessEvent, StopCause
from llmswap.process.state import ProcessState


class FakeStartError(Exception):
    pass


@dataclass
class FakeScript:
    """How fake processes behave; shared by all processes of one test."""

    start_delay: Callable[[str], float] = lambda model: 0.0
    fails: Callable[[str], bool] = lambda model: False
    stop_delay: float = 0.0
    # Called on every state change with (model, new state): lets a test check invariants at each instant.
    on_state: Callable[[str, ProcessState], None] | None = None
    starts: dict[str, int] = field(default_factory=dict)


class FakeProcess:
    def __init__(
        self, config: ModelConfig, on_event: Callable[[ProcessEvent], None], script: FakeScript
    ) -> None:
        self.id = config.id
        self.config = config
        self.asleep_since: float | None = None  # fakes never sleep: `sleep` stops them
        self._on_event = on_event
        self._script = script
        self._state = ProcessState.STOPPED
        self._start: asyncio.Task[None] | None = None
        self._in_flight = 0
        self.last_start_duration: float | None = None
        self.pid: int | None = None

    @property
    def state(self) -> ProcessState:
        return self._state

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def _set(self, state: ProcessState, kind: EventKind | None = None) -> None:
        self._state = state
        if self._script.on_state is not None:
            self._script.on_state(self.id, state)
        if kind is not None:
            self._on_event(ProcessEvent(self.id, kind))

    async def ensure_ready(self) -> LifeTimes | None:
        if self._state is ProcessState.READY:
            return None
        if self._state is ProcessState.SHUTDOWN:
            raise FakeStartError(f"[{self.id}] shutdown")
        if self._start is None or self._start.done():
            self._start = asyncio.get_running_loop().create_task(self._do_start())
            # Its failure is read by whoever still awaits it; when all left (an aborted swap), by nobody.
            self._start.add_done_callback(lambda task: task.cancelled() or task.exception())
        # Shield: a caller that goes away must not cancel the shared start.
        await asyncio.shield(self._start)
        return LifeTimes(start=self._script.start_delay(self.id))

    async def _do_start(self) -> None:
        self._script.starts[self.id] = self._script.starts.get(self.id, 0) + 1
        self._set(ProcessState.STARTING, "starting")
        await asyncio.sleep(self._script.start_delay(self.id))
        if self._state is not ProcessState.STARTING:
            raise FakeStartError("start aborted")
        if self._script.fails(self.id):
            self._set(ProcessState.STOPPED, "start_failed")
            raise FakeStartError(f"{self.id}: upstream command exited prematurely")
        self.pid = 1000 + len(self._script.starts)
        self._set(ProcessState.READY, "ready")

    async def sleep(self, timeout: float | None = None) -> bool:
        await self.stop(timeout)
        return False

    async def stop(self, timeout: float | None = None, *,
                   cause: StopCause = StopCause.REQUESTED) -> LifeTimes | None:
        if self._state in (ProcessState.STOPPED, ProcessState.SHUTDOWN):
            return None
        self._set(ProcessState.STOPPING, "stopping")
        await asyncio.sleep(self._script.stop_delay)
        self.pid = None
        if self._state is ProcessState.STOPPING:  # not if a shutdown finished meanwhile
            self._state = ProcessState.STOPPED
            if self._script.on_state is not None:
                self._script.on_state(self.id, ProcessState.STOPPED)
            self._on_event(ProcessEvent(self.id, "stopped", detail=cause.value, cause=cause))
        return LifeTimes(stop=self._script.stop_delay)

    async def expire(self) -> None:
        """Stop as the TTL would: behind the scheduler's back."""
        await self.stop(cause=StopCause.TTL)

    async def shutdown(self, timeout: float = 1.0) -> None:
        await self.stop(timeout)
        self._set(ProcessState.SHUTDOWN)

    def request_started(self) -> None:
        self._in_flight += 1

    def request_ended(self) -> None:
        self._in_flight -= 1


def fake_factory(script: FakeScript) -> Callable[[ModelConfig, Callable[[ProcessEvent], None]], FakeProcess]:
    def make(config: ModelConfig, on_event: Callable[[ProcessEvent], None]) -> FakeProcess:
        return FakeProcess(config, on_event, script)

    return make
