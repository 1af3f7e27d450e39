"""Catch blocking work on the event loop in a test that runs the server on its own loop: `SlowCallbacks`
runs the loop in asyncio's debug mode and installs llmswap's `LoopWatch` (`llmswap.server.loopwatch`),
which names every callback that held the loop 100 ms or more by its own CPU time, or by its wall-clock time
when it blocked in a system call, garbage-collection pauses taken off (a full collection of pytest's heap
takes 0.1-0.2 s here, inside whichever callback allocates; a 2-core machine starting a model server
preempts the loop's thread for as long: neither is the callback's doing).

Used by the server integration tests (`tests/integration/server/conftest.py`): a database call, a folder
scan or a `time.sleep` on the loop fails the test that made it, with the callback named. A step of the
test's own coroutine is the client's side (building its input), not the server's, and is not judged.
"""

from __future__ import annotations

import asyncio

from llmswap.server.loopwatch import LoopWatch

SLOW = 0.1  # seconds one callback may hold the loop


class SlowCallbacks:
    """What held one loop too long, from `watch` to `close`."""

    def __init__(self) -> None:
        self.caught: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._was_debug = False
        self._watch = LoopWatch(SLOW, self._held)

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._was_debug = loop.get_debug()
        loop.set_debug(True)
        loop.slow_callback_duration = 10.0  # the watch judges; asyncio's own wall-clock warnings stay quiet
        self._watch.install()

    def _held(self, message: str) -> None:
        if "(test_" not in message:  # a step of a test function's own coroutine: the client side
            self.caught.append(message)

    def close(self) -> None:
        self._watch.uninstall()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.set_debug(self._was_debug)
