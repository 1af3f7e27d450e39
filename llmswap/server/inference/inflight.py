"""The requests in flight: the frame each model-routed request runs in (`served`), the entries llama-swap's
`inflight` events show, and ending one from llmswap's side (`POST /api/inflight/{id}/cancel`, the end of a
graceful stop's grace), cleanly for its client.

One entry per model-routed request (the inference routes, and `/upstream/<model>/<path>` when the path is
itself an inference route) from the moment its model is known until its handler returns. An entry holds
what the request said (method, path, headers with credentials redacted, client address) and what has gone
back so far (response headers once sent, body bytes relayed). The tracker tells its listeners (the events
feed) `upsert` when an entry is added and when its response headers go out, and `remove` when it ends; byte
progress is read by whoever publishes, at its own pace (see `EventFeed`).

`served` is the one frame such a request runs in: its entry, its cut, the end of its activity recording
(begun by `begin_http` once its model is known, ended by `finish_http` with what was answered). The tracker
cancels the task serving the request (`InflightTracker.cut`); the cancellation unwinds through the router
grant (the model's in-flight count drops as for any finished request) and the upstream call (its
connection is closed, so the upstream stops generating). `served` then turns it into a clean end that says
why: an error event and the end of an event stream already under way, an error body when nothing was sent
yet, a cut connection for any other body already started (never a complete-looking truncated one).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import hdrs, web

from llmswap.activity.captures import redacted
from llmswap.activity.recording import Recording, RequestFacts, RequestRecord
from llmswap.config.model import ApiKey
from llmswap.server.http.connections import cancel_on_hangup
from llmswap.server.http.errors import error_response
from llmswap.server.http.middleware import CLIENT_GONE
from llmswap.server.inference.proxy import SseErrorFormatter, is_event_stream, openai_sse_error
from llmswap.server.observe.activity import RECORDER
from llmswap.server.state import API_KEY, STATE

log = logging.getLogger("llmswap.proxy")


def remote_ip(request: web.BaseRequest) -> str:
    """The client's address as llama-swap shows it: X-Forwarded-For's first element, X-Real-IP, the socket."""
    return _remote_ip(request.headers, request.remote)


def _remote_ip(headers: Mapping[str, str], peer: str | None) -> str:
    forwarded = headers.get("X-Forwarded-For", "").split(",")[0].strip()
    return forwarded or headers.get("X-Real-IP", "").strip() or (peer or "")


@dataclass(slots=True)
class InflightEntry:
    id: str
    started: float  # wall clock, for the timestamp
    started_monotonic: float
    model: str
    req_path: str
    method: str
    # The headers as received and as sent: redacted only when shown, so an untracked moment costs nothing.
    request_headers: Mapping[str, str]
    response_headers: Mapping[str, str] | None = None
    # The request's record: its bytes relayed so far are the entry's progress.
    record: RequestRecord = field(default_factory=RequestRecord)
    # For `cut`: the task serving the request, the response once it went out, and why llmswap ended it.
    task: asyncio.Task[Any] | None = None
    response: web.StreamResponse | None = None
    cut: Cut | None = None
    # While in flight: the request, read for the client's address only when the entry is shown; once let
    # go, the socket's address it had (the headers' addresses are in `request_headers`).
    request: web.BaseRequest | None = None
    peer: str | None = None
    tracker: InflightTracker | None = field(default=None, repr=False)  # the tracker it is in
    # The timestamp and request headers as shown, made the first time the entry is (they never change;
    # an entry is shown at least twice while a stream is open).
    shown: tuple[str, dict[str, str]] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def resp_bytes(self) -> int:
        return self.record.sent

    def as_dict(self, now_monotonic: float) -> dict[str, Any]:
        if self.shown is None:
            stamp = datetime.fromtimestamp(self.started, UTC).isoformat().replace("+00:00", "Z")
            self.shown = (stamp, redacted(self.request_headers))
        stamp, request_headers = self.shown
        peer = self.request.remote if self.request is not None else self.peer
        return {
            "id": self.id, "timestamp": stamp, "model": self.model, "req_path": self.req_path,
            "method": self.method, "req_headers": request_headers,
            "remote_ip": _remote_ip(self.request_headers, peer),
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

    def open(self, request: web.Request, record: RequestRecord, model: str, path: str | None = None,
             task: asyncio.Task[Any] | None = None) -> InflightEntry:
        """Add an entry for `request` (its `record`; routed to `model`; `path` as shown, default the
        request's), served by `task` (default: the current one); `close` it when the request ends."""
        entry = InflightEntry(
            str(next(self._ids)), self.wall_clock(), self.monotonic(), model,
            request.path if path is None else path, request.method, request.headers, record=record,
            task=task or asyncio.current_task(), request=request, tracker=self,
        )
        self._entries[entry.id] = entry
        request[ENTRY] = entry
        if self.listeners:
            self._tell("upsert", entry)
        return entry

    def close(self, entry: InflightEntry) -> None:
        if self._entries.pop(entry.id, None) is None:
            return
        request = entry.request
        if request is not None:
            request.pop(ENTRY, None)
            entry.peer = request.remote  # what `as_dict` shows once the request is let go
            entry.request = None
        if self.listeners:
            self._tell("remove", entry)

    def responded(self, entry: InflightEntry, response: web.StreamResponse) -> None:
        if entry.response_headers is None and entry.id in self._entries:
            entry.response = response
            entry.response_headers = response.headers
            if self.listeners:
                self._tell("upsert", entry)

    def cancel(self, entry_id: str) -> bool:
        """End the request `entry_id` (`POST /api/inflight/{id}/cancel`); False when no such request is in
        flight."""
        entry = self._entries.get(entry_id)
        return entry is not None and self.cut(entry, Cut(CANCELLED_STATUS, cancelled_message(entry_id),
                                                         "cancelled"))

    def cut_all(self, cut: Cut) -> int:
        """End every request in flight for the same reason (the end of a shutdown's grace); how many."""
        return sum(self.cut(entry, cut) for entry in list(self._entries.values()))

    def cut(self, entry: InflightEntry, cut: Cut) -> bool:
        """End `entry`'s request: its serving task is cancelled, and the frame it runs in (`served`) gives
        the client a clean end that says why. False when it already ended."""
        if entry.task is None or entry.task.done():
            return False
        if entry.cut is None:
            entry.cut = cut
            entry.task.cancel()
        return True


CANCELLED_STATUS = 502  # what llama-swap's activity shows for a cancelled request; the body says why


def cancelled_message(entry_id: str) -> str:
    return f"the request was cancelled through /api/inflight/{entry_id}/cancel"


@dataclass(frozen=True)
class Cut:
    """Why llmswap itself ended a request in flight: what its client, its activity row and the access log
    are told."""

    status: int  # the error's status (the response's, when nothing was sent yet)
    message: str
    reason: str  # one word for the access log's `cut=`: "cancelled", "shutdown"


INFLIGHT: web.AppKey[InflightTracker] = web.AppKey("llmswap_inflight", InflightTracker)


async def _on_prepare(request: web.BaseRequest, response: web.StreamResponse) -> None:
    entry = request.get(ENTRY)
    if entry is not None and entry.tracker is not None:
        entry.tracker.responded(entry, response)


# -------------------------------------------------------------------------------- the frame


def _key_name(keys: tuple[ApiKey, ...], key: object) -> str:
    for index, candidate in enumerate(keys):
        if candidate is key:  # the usual case: auth found it in this config
            return f"apiKeys[{index}]"
    for index, candidate in enumerate(keys):  # found in the config before a reload
        if candidate == key:
            return f"apiKeys[{index}]"
    return ""


def begin_http(request: web.Request, record: RequestRecord, *, model: str, requested: str,
               req_path: str) -> Recording:
    """The activity recording of `request`, whose wait and swap phases it reads from its `record`."""
    server_state = request.app[STATE]
    key = request.get(API_KEY)
    name = "" if key is None else _key_name(server_state.config.api_keys, key)
    # positional (cheaper): model, req_path, requested_model, origin, key_name, method, request_headers
    facts = RequestFacts(model, req_path, requested, "http", name, request.method, request.headers)
    return request.app[RECORDER].begin(facts, record)


def finish_http(recording: Recording, response: web.StreamResponse | None) -> None:
    """End `recording` with what was answered: the upstream's answer it saw pass, else the response
    llmswap made itself, else (no response: the handler was cancelled) the client's leaving. Its row and
    capture are kept with the recorder's next batch (`finish_soon`): the activity routes settle it first."""
    try:
        if recording.answered:
            recording.finish_soon()
        elif response is None:
            recording.finish_soon(CLIENT_GONE, error="the client went away before the answer")
        elif isinstance(response, web.Response):
            body = response.body if isinstance(response.body, bytes) else None
            recording.finish_soon(response.status, content_type=response.content_type, body=body)
        else:
            recording.finish_soon(response.status, content_type=response.content_type)
    except Exception:
        log.exception("activity: recording a request failed")


async def served(
    request: web.Request,
    work: Awaitable[web.StreamResponse],
    record: RequestRecord,
    *,
    model: str | None,
    path: str | None = None,
    recording: Recording | None = None,
    sse_error: SseErrorFormatter = openai_sse_error,
) -> web.StreamResponse:
    """Await `work` as one request in flight: an in-flight entry for `model` (None: not tracked; `path` as
    shown), a cancel of that entry turned into a clean end, and `recording` (begun with `record`) finished
    with what was answered.

    One frame instead of a wrapper per concern, and no watcher task: a client that hangs up cancels the
    handler's task (`connections.cancel_on_hangup`), which unwinds through the router's queue or grant and
    the upstream call like any cancellation; it is told apart from a cancel through
    `/api/inflight/{id}/cancel` or a stop by the entry's `cut`, and from a preemption by the router, which
    turns its own cancel into `Preempted` before it gets here."""
    task = asyncio.current_task()
    cancel_on_hangup(request, task)
    tracker = request.app[INFLIGHT]
    entry = tracker.open(request, record, model, path, task) if model is not None else None
    response: web.StreamResponse | None = None
    try:
        response = await work
        return response
    except asyncio.CancelledError:
        if entry is None or entry.cut is None or task is None:
            if recording is not None:
                recording.client_left()
            raise  # the client left
        task.uncancel()
        record.cut = entry.cut.reason
        response = await _cut_end(request, entry, entry.cut, sse_error, recording)
        return response
    finally:
        if entry is not None:
            tracker.close(entry)
        if recording is not None:  # its wait and the swap's phases it reads from `record`, its own
            if recording.answered:
                record.cached = recording.cached_tokens()  # the access line says it (`cached=`)
            finish_http(recording, response)


async def _cut_end(
    request: web.Request, entry: InflightEntry, cut: Cut, sse_error: SseErrorFormatter,
    recording: Recording | None,
) -> web.StreamResponse:
    """The client's clean end after llmswap cut its request: an error body when nothing was sent yet, an
    error event and the end of an event stream under way, else a cut connection (never a
    complete-looking truncated body)."""
    log.info("%s %s: %s", request.method, request.path, cut.message)
    if recording is not None:
        recording.fail(cut.status, cut.message)
    response = entry.response
    if response is None or not response.prepared:
        return error_response(request, cut.status, cut.message)
    if is_event_stream(response.headers.get(hdrs.CONTENT_TYPE, "")):
        with contextlib.suppress(ConnectionError):
            await response.write(sse_error(cut.status, cut.message))
            await response.write_eof()
        return response
    if request.transport is not None:
        request.transport.close()
    return response


async def list_route(request: web.Request) -> web.Response:
    """`GET /api/inflight`: the requests in flight now, oldest first (the entries `inflight` events carry)."""
    tracker = request.app[INFLIGHT]
    now = tracker.monotonic()
    return web.json_response({"requests": [entry.as_dict(now) for entry in tracker.entries()]})


async def cancel_route(request: web.Request) -> web.Response:
    if request.app[INFLIGHT].cancel(request.match_info["id"]):
        return web.json_response({"msg": "ok"})
    return error_response(request, 404, "inflight request not found")


def setup(app: web.Application) -> None:
    app.on_response_prepare.append(_on_prepare)
    app.router.add_get("/api/inflight", list_route)
    app.router.add_post("/api/inflight/{id}/cancel", cancel_route)
