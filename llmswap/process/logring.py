"""A bounded in-memory log: the last lines of one source (a model, the proxy, all upstreams) plus live tails.

Every method is called on the event-loop thread; nothing here locks. A slow subscriber never slows the
writer: its backlog is bounded and the oldest lines it has not read yet are dropped (and counted).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

DEFAULT_CAPACITY = 1000
DEFAULT_BACKLOG = 1000


@dataclass(frozen=True)
class LogEntry:
    timestamp: float  # wall-clock seconds (time.time()), for display
    line: str


class LogRing:
    def __init__(
        self,
        name: str = "",
        capacity: int = DEFAULT_CAPACITY,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"LogRing capacity must be >= 1, got {capacity}")
        self.name = name
        # (timestamp, line) pairs: a LogEntry is made only when one is asked for (`entries`), since a
        # line is appended on every request (the access log) and read rarely.
        self._entries: deque[tuple[float, str]] = deque(maxlen=capacity)
        self._subscribers: set[LogSubscription] = set()
        # Called with every line as it is appended, synchronously (the events stream's `logData`).
        self.listeners: list[Callable[[str], None]] = []
        self._wall_clock = wall_clock
        self.total = 0  # lines ever appended: a position that survives the ring wrapping around

    def __len__(self) -> int:
        return len(self._entries)

    def append(self, line: str) -> None:
        self._entries.append((self._wall_clock(), line))
        self.total += 1
        for subscriber in self._subscribers:
            subscriber._deliver(line)
        for listener in self.listeners:
            listener(line)

    def history(self) -> list[str]:
        return [line for _, line in self._entries]

    def entries(self) -> list[LogEntry]:
        return [LogEntry(timestamp, line) for timestamp, line in self._entries]

    def tail(self, count: int, *, since: int = 0) -> list[str]:
        """The last `count` lines, limited to those appended after position `since` (an earlier `total`)."""
        available = min(len(self._entries), self.total - since, count)
        if available <= 0:
            return []
        return [line for _, line in list(self._entries)[-available:]]

    def quoted_tail(self, count: int, *, since: int = 0) -> str:
        """`tail` for a message: "; last output:" and the lines indented, or nothing when there are none."""
        lines = self.tail(count, since=since)
        return "; last output:\n" + "\n".join(f"  {line}" for line in lines) if lines else ""

    def subscribe(self, backlog: int = DEFAULT_BACKLOG) -> LogSubscription:
        """A live tail of the lines appended from now on (history is separate: read it first if needed)."""
        subscription = LogSubscription(self, backlog)
        self._subscribers.add(subscription)
        return subscription

    def _unsubscribe(self, subscription: LogSubscription) -> None:
        self._subscribers.discard(subscription)


class LogSubscription:
    """An async iterator over new lines; close it (or use `async with`) when the reader goes away."""

    def __init__(self, ring: LogRing, backlog: int) -> None:
        self._ring = ring
        self._pending: deque[str] = deque(maxlen=max(1, backlog))
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self.dropped = 0  # lines lost because this reader fell more than `backlog` lines behind

    def _deliver(self, line: str) -> None:
        if len(self._pending) == self._pending.maxlen:
            self.dropped += 1
        self._pending.append(line)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def close(self) -> None:
        self._closed = True
        self._pending.clear()
        self._ring._unsubscribe(self)
        self._wake()

    @property
    def closed(self) -> bool:
        return self._closed

    def __aiter__(self) -> LogSubscription:
        return self

    async def __anext__(self) -> str:
        while not self._pending:
            if self._closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._pending.popleft()

    async def __aenter__(self) -> LogSubscription:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
