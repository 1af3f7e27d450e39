"""A watch on the event loop: names every callback that held it longer than a bound (`LoopWatch`).

Everything llmswap serves runs on one event loop, so a callback that blocks (a database call, a folder scan,
a `time.sleep`) or computes for long holds every request. asyncio's debug mode reports callbacks by their
wall-clock time, which on a busy machine also counts the time the thread waited for a CPU, and the garbage
collector's pauses, neither the callback's doing: a 2-core machine starting a model server preempts the
loop for a tenth of a second now and then. This watch measures each callback on the loop's thread with
`getrusage(RUSAGE_THREAD)` (about a microsecond a call): a callback held the loop for its own CPU time, or,
when it blocked in a system call (a voluntary context switch), for its whole wall-clock time; the garbage
collections that ran meanwhile are taken off either.

Off unless asked: `LLMSWAP_LOOP_WATCH_MS=100` in llmswap's environment logs a warning for each callback
that held the loop 100 ms or more (the tests run the server with it, and fail on such a line); tests that
run the server in their own process install it on their loop directly.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import resource
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("llmswap.loop")

ENV = "LLMSWAP_LOOP_WATCH_MS"

_Run = Callable[[asyncio.Handle], None]
_RUN = "_run"  # the method every callback of a loop runs through (asyncio.Handle._run), wrapped while watched


class LoopWatch:
    """While installed, `report(message)` is called for every callback of this thread's loop that held it
    at least `bound` seconds (see the module's doc). One at a time in a process."""

    _installed: LoopWatch | None = None

    def __init__(self, bound: float, report: Callable[[str], None]) -> None:
        self.bound = bound
        self.report = report
        self._thread = threading.get_ident()
        self._collected = 0.0  # seconds of garbage collection on this thread so far
        self._collecting: float | None = None
        self._original: _Run | None = None

    def install(self) -> None:
        if LoopWatch._installed is not None:
            raise RuntimeError("a loop watch is installed already")
        LoopWatch._installed = self
        original: _Run = vars(asyncio.Handle)[_RUN]
        self._original = original
        watch = self

        def timed(handle: asyncio.Handle) -> None:
            if threading.get_ident() != watch._thread:
                original(handle)
                return
            began, before, collected = time.perf_counter(), resource.getrusage(resource.RUSAGE_THREAD), \
                watch._collected
            try:
                original(handle)
            finally:
                wall = time.perf_counter() - began
                if wall >= watch.bound:
                    watch._judge(handle, wall, before, watch._collected - collected)

        setattr(asyncio.Handle, _RUN, timed)  # every callback of every loop: judged on this thread only
        gc.callbacks.append(self._on_collection)

    def uninstall(self) -> None:
        if self._original is not None:
            setattr(asyncio.Handle, _RUN, self._original)
            self._original = None
        if self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)
        if LoopWatch._installed is self:
            LoopWatch._installed = None

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if threading.get_ident() != self._thread:
            return
        if phase == "start":
            self._collecting = time.perf_counter()
        elif self._collecting is not None:
            self._collected += time.perf_counter() - self._collecting
            self._collecting = None

    def _judge(self, handle: asyncio.Handle, wall: float, before: resource.struct_rusage,
               collecting: float) -> None:
        after = resource.getrusage(resource.RUSAGE_THREAD)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        blocked = after.ru_nvcsw > before.ru_nvcsw  # it waited in a system call (sleep, I/O, a lock)
        held = (wall if blocked else cpu) - collecting
        if held >= self.bound:
            self.report(f"{describe(handle)} held the event loop for {held:.3f}s "
                        f"({'blocking in a system call' if blocked else 'computing'}; wall {wall:.3f}s, "
                        f"CPU {cpu:.3f}s, garbage collection {collecting:.3f}s)")


def describe(handle: asyncio.Handle) -> str:
    """A task's step by its task's name and coroutine (`task 'router:group' (RunLoop._run)`), any other
    callback as asyncio shows it."""
    task = getattr(getattr(handle, "_callback", None), "__self__", None)
    if isinstance(task, asyncio.Task):
        coroutine = task.get_coro()
        return f"task {task.get_name()!r} ({getattr(coroutine, '__qualname__', repr(coroutine))})"
    return repr(handle)


def watch_from_environment() -> LoopWatch | None:
    """Install a watch on the running loop logging a warning per callback over `LLMSWAP_LOOP_WATCH_MS`,
    when that is set."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    try:
        bound = float(value) / 1000
    except ValueError:
        log.warning("%s=%r is not a number of milliseconds; the loop is not watched", ENV, value)
        return None
    watch = LoopWatch(bound, lambda message: log.warning("slow callback: %s", message))
    watch.install()
    # The watch judges; asyncio's debug mode (PYTHONASYNCIODEBUG) would also warn by wall-clock time.
    asyncio.get_running_loop().slow_callback_duration = 3600.0
    log.info("watching the event loop: a callback holding it %g ms or more is logged", bound * 1000)
    return watch
