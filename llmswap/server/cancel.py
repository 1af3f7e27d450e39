"""Ending a request in flight on request (`POST /api/inflight/{id}/cancel`), cleanly for its client.

The tracker cancels the task serving the request (`InflightTracker.cancel`); the cancellation unwinds
through the router grant (the model's in-flight count drops as for any finished request) and the upstream
call (its connection is closed, so the upstream stops generating). `cancellable` then turns it into a
clean end: an error event and the end of an event stream already under way, an error body when nothing was
sent yet, a cut connection for any other body already started (never a complete-looking truncated one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web

from llmswap.server.errors import error_response
from llmswap.server.inflight import ENTRY, tracker_of
from llmswap.server.proxy import SseErrorFormatter, is_event_stream, openai_sse_error
from llmswap.server.state import state

log = logging.getLogger("llmswap.proxy")

CANCELLED_STATUS = 502  # what llama-swap's activity shows for a cancelled request; the body says why


def cancelled_message(entry_id: str) -> str:
    return f"the request was cancelled through /api/inflight/{entry_id}/cancel"


async def cancellable(
    request: web.Request,
    work: Awaitable[web.StreamResponse],
    sse_error: SseErrorFormatter = openai_sse_error,
    on_cancel: Callable[[int, str], None] | None = None,
) -> web.StreamResponse:
    """Await `work` (which runs inside a tracked in-flight entry); a cancel of that entry becomes a clean
    end for the client instead of a dropped connection. `on_cancel(status, message)` is told (activity)."""
    try:
        return await work
    except asyncio.CancelledError:
        entry = request.get(ENTRY)
        task = asyncio.current_task()
        if entry is None or not entry.cancelled or task is None:
            raise
        task.uncancel()
        message = cancelled_message(entry.id)
        log.info("%s %s: %s", request.method, request.path, message)
        if on_cancel is not None:
            on_cancel(CANCELLED_STATUS, message)
        response = entry.response
        if response is None or not response.prepared:
            return error_response(request, CANCELLED_STATUS, message)
        if is_event_stream(response.headers.get(hdrs.CONTENT_TYPE, "")):
            with contextlib.suppress(ConnectionError):
                await response.write(sse_error(CANCELLED_STATUS, message))
                await response.write_eof()
            return response
        if request.transport is not None:
            request.transport.close()
        return response


async def list_route(request: web.Request) -> web.Response:
    """`GET /api/inflight`: the requests in flight now, oldest first (the entries `inflight` events carry)."""
    tracker = tracker_of(state(request))
    now = tracker.monotonic()
    return web.json_response({"requests": [entry.as_dict(now) for entry in tracker.entries()]})


async def cancel_route(request: web.Request) -> web.Response:
    if tracker_of(state(request)).cancel(request.match_info["id"]):
        return web.json_response({"msg": "ok"})
    return error_response(request, 404, "inflight request not found")


def setup(app: web.Application) -> None:
    app.router.add_get("/api/inflight", list_route)
    app.router.add_post("/api/inflight/{id}/cancel", cancel_route)
