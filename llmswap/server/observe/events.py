"""`GET /api/events`: the server-sent event stream UIs and scripts follow, in llama-swap's envelope.

Every frame is `event:message` plus `data:{"type": ..., "data": "<JSON as a string>"}` (see `eventbus`).
A stream opens with, in this order: `logData` (proxy history), `logData` (upstream history),
`modelStatus`, `uiConfig`, `profileChanged`, an `inflight` snapshot, then llmswap's `snapshot`; then it
follows changes (`event_feed`). A `: keepalive` comment goes out after ~15 s of silence. A client that
falls behind loses the frames it could not take and gets the state again (`modelStatus`, `profileChanged`,
`inflight` snapshot, `snapshot` with reason `resync`). The stream ends when the client leaves, the server
shuts down or the config is reloaded. The README's "Events" section lists every type and its payload.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from llmswap.server.observe.event_feed import EventFeed
from llmswap.server.observe.eventbus import KEEPALIVE, Event, Mark, Subscription

log = logging.getLogger("llmswap.events")

FEED: web.AppKey[EventFeed] = web.AppKey("llmswap_events", EventFeed)
CLIENT_CHECK_INTERVAL = 0.5  # how often a quiet stream checks that its client is still there
HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "Connection": "keep-alive",
    "X-Content-Type-Options": "nosniff",
    "X-Accel-Buffering": "no",  # a buffering reverse proxy in front would hold events back
}


def setup(app: web.Application) -> None:
    app.router.add_get("/api/events", stream)
    app.on_shutdown.append(_end_streams)


async def _end_streams(app: web.Application) -> None:
    await app[FEED].close()


async def stream(request: web.Request) -> web.StreamResponse:
    feed = request.app[FEED]
    subscription = feed.subscribe()
    try:
        # No await between subscribing and building the opening frames: nothing falls between the two.
        opening = feed.opening_frames()
        response = web.StreamResponse(headers=HEADERS)
        await response.prepare(request)
        try:
            await response.write(b"".join(frame.encode() for frame in opening))
            await _follow(request, response, feed, subscription)
            await response.write_eof()
        except ConnectionError:
            log.debug("event stream: the client left")
        return response
    finally:
        subscription.close()


async def _follow(
    request: web.Request, response: web.StreamResponse, feed: EventFeed, subscription: Subscription
) -> None:
    loop = asyncio.get_running_loop()
    last_write = loop.time()
    while True:
        item = await subscription.next(timeout=min(CLIENT_CHECK_INTERVAL, feed.keepalive))
        if item is Mark.CLOSED:
            return
        if item is Mark.RESYNC:
            await response.write(b"".join(frame.encode() for frame in feed.resync_frames()))
        elif isinstance(item, Event):
            await response.write(item.encode())
        else:
            # aiohttp does not cancel a handler whose client left: look, rather than wait for an event.
            transport = request.transport
            if transport is None or transport.is_closing():
                return
            if loop.time() - last_write < feed.keepalive:
                continue
            await response.write(KEEPALIVE)
        last_write = loop.time()
