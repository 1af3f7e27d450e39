"""The requests in flight, as llama-swap's `inflight` events show them: one entry per model-routed request
(the inference routes, and `/upstream/<model>/<path>` when the path is itself an inference route) from the
moment its model is known until its handler returns.

An entry holds what the request said (method, path, headers with credentials redacted, client address) and
what has gone back so far (response headers once sent, body bytes relayed). The tracker tells its listeners
(the events feed) `upsert` when an entry is added and when its response headers go out, and `remove` when
it ends; byte progress is read by whoever publishes, at its own pace (see `EventFeed`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from llmswap.activity.captures import redacted
from llmswap.server.middleware import note_first_byte
from llmswap.server.state import STATE, ServerState

INFLIGHT_KEY = "inflight"  # ServerState.extras key of the app's InflightTracker


def remote_ip(request: web.BaseRequest) -> str:
    """The client's address as llama-swap shows it: X-Forwarded-For's first element, X-Real-IP, the socket."""
    forwarded = request.headers.get("X-Forwarded-For", "").split(",")[0].strip()
    return forwarded or request.headers.get("X-Real-IP", "").strip() or (request.remote or "")


@dataclass
class InflightEntry:
    id: str
    started: float  # wall clock, for the timestamp
    started_monotonic: float
    model: str
    req_path: str
    method: str
    # The headers as received and as sent: redacted only when shown, so an untracked moment costs nothing.
    request_headers: Mapping[str, str]
    remote_ip: str
    response_headers: Mapping[str, str] | None = None
    resp_bytes: int = 0
    # For `cancel`: the task serving the request, the response once it went out, and whether it was cancelled.
    task: asyncio.Task[Any] | None = None
    response: web.StreamResponse | None = None
    cancelled: bool = False
    # While in flight: the request, read for the client's address only when the entry is shown.
    request: web.BaseRequest | None = None

    def as_dict(self, now_monotonic: float) -> dict[str, Any]:
        stamp = datetime.fromtimestamp(self.started, UTC).isoformat().replace("+00:00", "Z")
        return {
            "id": self.id, "timestamp": stamp, "model": self.model, "req_path": self.req_path,
            "method": self.method, "req_headers": redacted(self.request_headers),
            "remote_ip": remote_ip(self.request) if self.request is not None else self.remote_ip,
            "resp_headers": redacted(self.response_headers or {}), "resp_bytes": self.resp_bytes,
            "elapsed_ms": int((now_monotonic - self.started_monotonic) * 1000),
        }


# Told ("upsert" | "remove", entry) on every change. Must not block.
InflightListener = Callable[[str, InflightEntry], None]
ENTRY: web.RequestKey[InflightEntry] = web.RequestKey("llmswap_inflight", InflightEntry)


class InflightTracker:
    """The app's entries, by id, in the order they began."""

    def __init__(self, *, wall_clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._ids = itertools.count(1)
        self._entries: dict[str, InflightEntry] = {}
        self.listeners: list[InflightListener] = []
        self.wall_clock = wall_clock
        self.monotonic = monotonic

    def entries(self) -> list[InflightEntry]:
        return list(self._entries.values())

    def _tell(self, operation: str, entry: InflightEntry) -> None:
        for listener in tuple(self.listeners):
            listener(operation, entry)

    def open(self, request: web.Request, model: str, path: str | None = None,
             task: asyncio.Task[Any] | None = None) -> InflightEntry:
        """Add an entry for `request` (routed to `model`; `path` as shown, default the request's), served by
        `task` (default: the current one); `close` it when the request ends."""
        entry = InflightEntry(
            id=str(next(self._ids)), started=self.wall_clock(), started_monotonic=self.monotonic(),
            model=model, req_path=request.path if path is None else path, method=request.method,
            request_headers=request.headers, remote_ip="", task=task or asyncio.current_task(),
            request=request,
        )
        self._entries[entry.id] = entry
        request[ENTRY] = entry
        if self.listeners:
            self._tell("upsert", entry)
        return entry

    def close(self, entry: InflightEntry) -> None:
        if self._entries.pop(entry.id, None) is None:
            return
        if entry.request is not None:
            entry.request.pop(ENTRY, None)
            entry.remote_ip = remote_ip(entry.request)  # what `as_dict` shows once the request is let go
            entry.request = None
        if self.listeners:
            self._tell("remove", entry)

    def responded(self, entry: InflightEntry, response: web.StreamResponse) -> None:
        if entry.id in self._entries and entry.response_headers is None:
            entry.response = response
            entry.response_headers = response.headers
            self._tell("upsert", entry)

    def cancel(self, entry_id: str) -> bool:
        """End the request `entry_id`: its serving task is cancelled, and the code that serves it (see
        `llmswap.server.cancel`) gives the client a clean end. False when no such request is in flight."""
        entry = self._entries.get(entry_id)
        if entry is None or entry.task is None or entry.task.done():
            return False
        if not entry.cancelled:
            entry.cancelled = True
            entry.task.cancel()
        return True


def tracker_of(server_state: ServerState) -> InflightTracker:
    return server_state.extra(INFLIGHT_KEY, InflightTracker, InflightTracker)


def note_relayed(request: web.BaseRequest, size: int) -> None:
    """`size` bytes of the upstream's answer went to the client: the access record's first byte, the
    in-flight entry's byte count."""
    note_first_byte(request)
    entry = request.get(ENTRY)
    if entry is not None:
        entry.resp_bytes += size


async def _on_prepare(request: web.BaseRequest, response: web.StreamResponse) -> None:
    entry = request.get(ENTRY)
    if entry is not None:
        tracker_of(request.app[STATE]).responded(entry, response)


def setup(app: web.Application) -> None:
    app.on_response_prepare.append(_on_prepare)
