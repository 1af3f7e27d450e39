"""Catch blocking work on the event loop: asyncio's debug mode names every callback (a task's step, a timer,
an I/O handler) that held the loop longer than `slow_callback_duration`, in a warning of the `asyncio`
logger; `SlowCallbacks` collects those warnings while a test runs on the loop.

Used by the server integration tests (`tests/integration/server/conftest.py`), where the whole server runs
on the test's loop: a database call, a folder scan or a `time.sleep` on the loop fails the test that made
it, with the callback's name and how long it held the loop.

The cyclic garbage collector stops the thread that allocates, whatever it runs: in a test process with
pytest's heap a full collection takes 0.1-0.2 s here, inside whichever callback triggered it. That pause
is not the callback's doing, so the time collections took while a callback ran is taken off its time
before it is judged (and reported beside it). A step of the test's own coroutine is the client's side, not
the server's, and is not judged.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import time
from typing import Any

SLOW = 0.1  # seconds one callback may hold the loop
_TOOK = re.compile(r" took (\d+(?:\.\d+)?) seconds$")


class SlowCallbacks(logging.Handler):
    """The slow-callback warnings asyncio's debug mode logs on one loop, from `watch` to `close`."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.caught: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._was_debug = False
        self._slow = SLOW
        self._collections: list[tuple[float, float]] = []  # (start, end) of each garbage collection
        self._collecting: float | None = None

    def watch(self, loop: asyncio.AbstractEventLoop, slow: float = SLOW) -> None:
        self._loop = loop
        self._slow = slow
        self._was_debug = loop.get_debug()
        loop.set_debug(True)
        # asyncio warns from a quarter of the bound: what the collector took is then taken off the time.
        loop.slow_callback_duration = slow / 4
        gc.callbacks.append(self._collected)
        logging.getLogger("asyncio").addHandler(self)

    def _collected(self, phase: str, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._collecting = now
        elif self._collecting is not None:
            self._collections.append((self._collecting, now))
            self._collecting = None

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        took = _TOOK.search(message)
        if not message.startswith("Executing ") or took is None or " coro=<test_" in message:
            return  # not a callback, or a step of the test itself (the client side, building its input)
        ended = time.perf_counter()  # asyncio logs as the callback returns
        seconds = float(took.group(1))
        began = ended - seconds
        collecting = sum(max(0.0, min(end, ended) - max(start, began)) for start, end in self._collections)
        if seconds - collecting > self._slow:
            self.caught.append(f"{message} ({collecting:.3f} s of it collecting garbage)")

    def close(self) -> None:
        logging.getLogger("asyncio").removeHandler(self)
        if self._collected in gc.callbacks:
            gc.callbacks.remove(self._collected)
        if self._loop is not None and not self._loop.is_closed():
            self._loop.set_debug(self._was_debug)
        super().close()
