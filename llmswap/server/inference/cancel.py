"""Ending a request in flight from llmswap's side (`POST /api/inflight/{id}/cancel`, the end of a graceful
stop's grace), cleanly for its client.

Owns `served`, the one frame a model-routed request runs in (its in-flight entry, its cut, the end of its
activity recording). The tracker cancels the task serving the request (`InflightTracker.cut`); the
cancellation unwinds through the router grant (the model's in-flight count drops as for any finished
request) and the upstream call (its connection is closed, so the upstream stops generating). `served`
then turns it into a clean end that says why: an error event and the end of an event stream already under
way, an error body when nothing was sent yet, a cut connection for any other body already started (never
a complete-looking truncated one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable

from aiohttp import hdrs, web

from llmswap.activity.recording import Recording, RequestRecord
from llmswap.server.http.connections import cancel_on_hangup
from llmswap.server.http.errors import error_response
from llmswap.server.inference.inflight import INFLIGHT, Cut, InflightEntry
from llmswap.server.inference.proxy import SseErrorFormatter, is_event_stream, openai_sse_error
from llmswap.server.observe.activity import finish_http

log = logging.getLogger("llmswap.proxy")


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
    app.router.add_get("/api/inflight", list_route)
    app.router.add_post("/api/inflight/{id}/cancel", cancel_route)
