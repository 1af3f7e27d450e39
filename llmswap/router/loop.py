"""The router's run loop: one queue of events handled one at a time in order, and the scheduler's tick.

Every scheduler call happens here (or in a caller's step with nothing ahead of it in the queue, which is
the same order: see `end` and `RequestDesk.grant_now`), so scheduler state needs no locks. The loop knows
nothing of what an event means: the router hands each to `handle` (True once the loop must end) and reads
the next deadline the scheduler wants a `Tick` at from `next_deadline`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from llmswap.router.types import Shutdown, Tick

log = logging.getLogger("llmswap.router")


class RunLoop:
    """The queue, the task that drains it, the tick timer and the counters tests wait on."""

    def __init__(self, name: str, handle: Callable[[object], bool],
                 next_deadline: Callable[[], float | None], clock: Callable[[], float]) -> None:
        self.name = name
        self._handle = handle
        self._next_deadline = next_deadline
        self._clock = clock
        self._events: asyncio.Queue[object] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._tick_handle: asyncio.TimerHandle | None = None
        self._tick_at: float | None = None
        self.processed = 0  # events fully handled; tests wait on it instead of sleeping
        self._idle = asyncio.Event()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"router:{self.name}")

    @property
    def running(self) -> bool:
        """Started and not ended."""
        return self._task is not None and not self._task.done()

    @property
    def started(self) -> bool:
        return self._task is not None

    @property
    def quiet(self) -> bool:
        """No event waits in the queue: a caller's step sees the world exactly as the loop would next."""
        return self._events.empty()

    def post(self, event: object) -> None:
        """Queue `event` (dropped once the loop has ended: nobody would handle it)."""
        if self.running:
            self._events.put_nowait(event)

    def put(self, event: object) -> None:
        """Queue `event` even before the loop starts (a request or an unload waits for it)."""
        self._events.put_nowait(event)

    def handled_here(self, handle: Callable[[], None]) -> None:
        """Handle an event outside the queue (the caller's, with nothing ahead of it) and count it as the loop
        would."""
        try:
            handle()
        except Exception:
            log.exception("router %s: error handling an event", self.name)
        self.processed += 1
        self.arm_tick()

    async def stop(self) -> None:
        """Post `Shutdown` and wait for the loop to end."""
        if self._task is not None:
            self._events.put_nowait(Shutdown())
            await self._task

    async def wait_idle(self) -> None:
        """Wait until every posted event has been handled (tests use this instead of sleeping)."""
        while not self._events.empty() or not self._idle.is_set():
            self._idle.clear()
            await self._idle.wait()

    def tick_now(self) -> None:
        """A `Tick` has come: the timer that posted it is spent."""
        self._tick_at = None

    async def _run(self) -> None:
        while True:
            if self._events.empty():
                self._idle.set()
            event = await self._events.get()
            self._idle.clear()
            if self._handle(event):
                self._idle.set()
                return
            self.processed += 1
            self.arm_tick()

    def arm_tick(self) -> None:
        deadline = self._next_deadline()
        if deadline == self._tick_at:
            return
        if self._tick_handle is not None:
            self._tick_handle.cancel()
            self._tick_handle = None
        self._tick_at = deadline
        if deadline is not None:
            delay = max(0.0, deadline - self._clock())
            self._tick_handle = asyncio.get_running_loop().call_later(delay, self.post, Tick())
