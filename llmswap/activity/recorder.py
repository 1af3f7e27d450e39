"""The recorder: the one object the request path talks to (`begin` → `Recording`), and the owner of what
is recorded: the activity log (in memory, bounded by `metricsMaxInMemory`, or the SQLite store), the
capture ring (`captureBuffer`) and the listeners told of each stored row (the `activity` event, metrics).

The request path (today `llmswap.server.inference.routes` and the task queue; later the dispatcher) calls
`begin(RequestFacts(...))`, feeds the `Recording` as the answer passes, and calls `finish` (the row is kept
now) or `finish_soon` (the HTTP routes: the row is kept with the next batch, see SETTLE_BATCH; whatever
reads activity, captures or token counts calls `settle` first).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from llmswap.activity.captures import MIB, Capture, CaptureRing, raw_size
from llmswap.activity.query import ActivityQuery, Page, answer, stat_row, stats
from llmswap.activity.record import ActivityRecord
from llmswap.activity.recording import Recording, RequestFacts, RequestRecord

log = logging.getLogger("llmswap.activity")

OFFLOAD_CAPTURE = 256 * 1024  # captures larger than this are compressed off the event loop
DEFAULT_MAX_IN_MEMORY = 1000
DEFAULT_CAPTURE_MB = 5
# Recordings ended with `finish_soon` are read together, up to this many or after this long: reading a run
# of answers in a row costs about half as much as reading each between serving others (its code and data
# stay in the CPU's caches).
SETTLE_BATCH = 64
SETTLE_AFTER = 0.05  # seconds
SETTLE_BYTES = 1024 * 1024  # or once the answers they hold add up to this (an embedding can be megabytes)

ActivityListener = Callable[[ActivityRecord], None]


@dataclass(frozen=True)
class ActivitySettings:
    max_in_memory: int = DEFAULT_MAX_IN_MEMORY  # rows kept in memory (≤ 0 → the default)
    capture_mb: float = DEFAULT_CAPTURE_MB  # the capture ring's size in MiB (≤ 0: captures off)


class ActivityLog(Protocol):
    """Where rows are kept and asked about. `add` must not block; `stored` is called (on the loop) once the
    row can be read back."""

    def add(self, record: ActivityRecord, stored: Callable[[ActivityRecord], None]) -> None: ...

    async def page(self, query: ActivityQuery) -> Page: ...

    async def stats(self, model: str | None) -> dict[str, Any]: ...

    def resize(self, max_rows: int) -> None: ...

    async def close(self) -> None: ...


class MemoryLog:
    """The newest `max_rows` rows, in memory."""

    def __init__(self, max_rows: int = DEFAULT_MAX_IN_MEMORY) -> None:
        self.rows: deque[ActivityRecord] = deque(maxlen=max(1, max_rows))

    def add(self, record: ActivityRecord, stored: Callable[[ActivityRecord], None]) -> None:
        self.rows.append(record)
        stored(record)

    async def page(self, query: ActivityQuery) -> Page:
        return answer(list(self.rows), query)

    async def stats(self, model: str | None) -> dict[str, Any]:
        return stats([stat_row(r) for r in self.rows if model is None or r.model == model])

    def resize(self, max_rows: int) -> None:
        if self.rows.maxlen != max(1, max_rows):
            self.rows = deque(self.rows, maxlen=max(1, max_rows))

    async def close(self) -> None:
        pass


class ActivityRecorder:
    def __init__(self, settings: ActivitySettings | None = None, log_store: ActivityLog | None = None,
                 first_id: int = 1) -> None:
        settings = settings or ActivitySettings()
        self.settings = settings
        self.log: ActivityLog = log_store if log_store is not None else MemoryLog(self._max_rows(settings))
        self.captures = CaptureRing(int(settings.capture_mb * MIB))
        self.listeners: list[ActivityListener] = []
        self._ids = itertools.count(first_id)
        self._ended: list[Recording] = []  # ended with `finish_soon`, not yet settled
        self._ended_bytes = 0  # the answers they hold
        self._settling: asyncio.TimerHandle | None = None

    @staticmethod
    def _max_rows(settings: ActivitySettings) -> int:
        return settings.max_in_memory if settings.max_in_memory > 0 else DEFAULT_MAX_IN_MEMORY

    def configure(self, settings: ActivitySettings) -> None:
        """A reload's settings: the bounds change in place; rows and captures that fit stay."""
        self.settings = settings
        self.log.resize(self._max_rows(settings))
        budget = int(settings.capture_mb * MIB)
        if budget != self.captures.budget:
            self.captures = CaptureRing(budget)

    def use_log(self, log_store: ActivityLog, *, first_id: int) -> None:
        """Keep rows in `log_store` from now on (the store, once opened), numbering on from `first_id`."""
        self.log = log_store
        self._ids = itertools.count(max(first_id, next(self._ids)))

    async def close(self) -> None:
        self.settle()
        await self.log.close()

    def begin(self, facts: RequestFacts, record: RequestRecord | None = None) -> Recording:
        """The recording of a request described by `facts`, whose wait is read from `record` (None: a fresh
        one, for a request the caller keeps no record of)."""
        return Recording(facts, self, self.captures.budget, record)

    def settle_soon(self, recording: Recording) -> None:
        """Keep `recording`'s row and capture with the next batch (see SETTLE_BATCH)."""
        ended = self._ended
        ended.append(recording)
        self._ended_bytes += recording.held
        if len(ended) >= SETTLE_BATCH or self._ended_bytes >= SETTLE_BYTES:
            self.settle()
        elif self._settling is None:
            loop = _running_loop()
            if loop is None:
                self.settle()
            else:
                self._settling = loop.call_later(SETTLE_AFTER, self.settle)

    def settle(self) -> None:
        """Keep the rows and captures of every recording ended so far: whoever reads activity, captures or
        token counts calls this first."""
        if self._settling is not None:
            self._settling.cancel()
            self._settling = None
        ended = self._ended
        if not ended:
            return
        self._ended = []
        self._ended_bytes = 0
        for recording in ended:
            try:
                recording.settle()
            except Exception:
                log.exception("activity: recording a request failed")

    def next_id(self) -> int:
        return next(self._ids)

    def keep(self, record: ActivityRecord, capture: Capture | None) -> None:
        """A finished recording's row (into the log, then the listeners) and capture (into the ring)."""
        if capture is not None:
            try:
                self._keep_capture(capture)
            except Exception:
                log.exception("activity: keeping the capture of request %d failed", record.id)
        self.log.add(record, self._stored)

    def _keep_capture(self, capture: Capture) -> None:
        raw = raw_size(capture)
        loop = _running_loop() if raw > OFFLOAD_CAPTURE else None
        if loop is None:
            self.captures.add(capture, raw)
            return
        # Compressing megabytes takes milliseconds: on a worker thread (zlib lets go of the GIL), so other
        # requests are not held up; the ring (the loop's) takes the result when it is ready.
        ring = self.captures
        done = loop.run_in_executor(None, capture.compress)

        def keep(compressed: asyncio.Future[bytes]) -> None:
            if not compressed.cancelled() and compressed.exception() is None:
                ring.add_compressed(capture.id, compressed.result())

        done.add_done_callback(keep)

    def _stored(self, record: ActivityRecord) -> None:
        for listener in self.listeners:
            try:
                listener(record)
            except Exception:
                log.exception("activity listener failed for request %d", record.id)

    def has_capture(self, activity_id: int) -> bool:
        return activity_id in self.captures


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
