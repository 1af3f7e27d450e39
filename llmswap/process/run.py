"""One life of an upstream child (`Run`), as the `Process` supervisor drives it, and how a life ends."""

from __future__ import annotations

import asyncio
import enum
import signal
from typing import Any, Literal

from llmswap.process.child import Child
from llmswap.process.errors import StartFailed
from llmswap.process.events import LifeTimes, StopCause


class Outcome(enum.Enum):
    READY = "ready"
    ABORTED = "aborted"
    EXITED = "exited"
    TIMED_OUT = "timed out"
    NO_ENDPOINT = "no health endpoint"  # the server answers 404 at checkEndpoint


class Run:
    """One life of the child, from the decision to start until it is reaped."""

    def __init__(self, loop: asyncio.AbstractEventLoop, grace: float) -> None:
        self.ready: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.wake = asyncio.Event()  # "something changed": the supervisor re-reads the flags below
        self.stop_requested = False
        self.stop_cause = StopCause.REQUESTED
        self.grace = grace  # graceful-stop seconds for the stop under way; a later request may shorten it
        self.child: Child | None = None
        self.output_mark = 0  # LogRing position when this run spawned, to quote only its own output
        self.task: asyncio.Task[None] | None = None
        # A sleep or a wake asked of the ready or sleeping server, and its outcome (False: it failed).
        self.asked: tuple[Literal["sleep", "wake"], asyncio.Future[bool]] | None = None
        self.times = LifeTimes()  # this life's phases so far (what `ensure_ready` and `stop` answer)

    def ask(self, what: Literal["sleep", "wake"]) -> asyncio.Future[bool]:
        """Ask the supervisor to put the server to sleep or wake it; callers asking the same share one."""
        if self.asked is None or self.asked[0] != what or self.asked[1].done():
            self.asked = (what, asyncio.get_running_loop().create_future())
            self.wake.set()
        return self.asked[1]

    def request_stop(self, grace: float, cause: StopCause) -> None:
        if self.stop_requested:
            self.grace = min(self.grace, grace)
        else:
            self.stop_requested = True
            self.stop_cause = cause
            self.grace = grace
        self.wake.set()

    async def pause(self, limit: float | None, *also: asyncio.Future[Any]) -> None:
        """Wait until something may have changed (a wake-up, one of `also`, `limit` seconds); the
        supervisor re-checks everything afterwards."""
        if not self.wake.is_set():
            waker: asyncio.Future[Any] = asyncio.ensure_future(self.wake.wait())
            try:
                await asyncio.wait({waker, *also}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waker.cancel()
        self.wake.clear()

    def fail(self, error: StartFailed) -> None:
        """Resolve the start with `error` unless it is already resolved; a sleep or wake still asked of a
        life that ends did not happen."""
        if not self.ready.done():
            self.ready.set_exception(error)
            self.ready.exception()  # retrieved: a start nobody waits for any more must not log a warning
        if self.asked is not None and not self.asked[1].done():
            self.asked[1].set_result(False)


def describe_exit(exit_code: int | None) -> str:
    if exit_code is None:
        return "exit code unknown"
    if exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        return f"exit code {exit_code}, killed by {name}"
    return f"exit code {exit_code}"
