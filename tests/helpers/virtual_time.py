"""Run a coroutine on an event loop whose clock is virtual, for tests of in-process concurrency.

Time passes only when nothing is ready to run, and then jumps straight to the next timer: sleeps cost nothing,
and the order in which tasks run depends on the program and its seed alone, not on how fast the machine is.
Only for code that waits on asyncio itself (fake processes, queues, timers): no sockets, subprocesses or
threads, whose readiness a virtual clock knows nothing of. When nothing is ready and no timer is set, the
program could never move again, and the loop says so instead of hanging.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class Stuck(RuntimeError):
    """Nothing is ready to run and no timer is set: the program under test waits for itself."""


class _ClockSelector(selectors.BaseSelector):
    """A selector that never waits for a file: asked to wait, it moves the virtual clock instead. The loop's
    own wake-up pipe is registered with it, and never becomes ready (nothing runs on another thread)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Stuck("nothing is ready to run and no timer is set: the program would wait forever")
        self.now += timeout
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose `time()` is the virtual clock above (it starts at 0)."""

    def __init__(self) -> None:
        self._clock = _ClockSelector()
        super().__init__(self._clock)

    def time(self) -> float:
        return self._clock.now


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, on a `VirtualTimeLoop`."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)
