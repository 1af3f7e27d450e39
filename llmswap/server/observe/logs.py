"""The log routes: `/logs` (history as text) and `/logs/stream[/<id>]` (history, then live lines).

A log id is `proxy` (llmswap's own records), `upstream` (every model's output), or a model id or alias
(that model's output); no id means proxy and upstream together, merged by time. A stream subscribes
before it reads the history, with no await in between, so no line is lost or repeated at the seam; it
ends when the client goes away or the server shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence

from aiohttp import web

from llmswap.process.logring import LogEntry, LogRing, LogSubscription
from llmswap.server.http.errors import error_response
from llmswap.server.state import ServerState, state

log = logging.getLogger("llmswap.logs")

INVALID_LOGGER = "invalid logger. Use 'proxy', 'upstream' or a model's ID"
# How often a quiet stream checks whether its client is still there.
CLIENT_CHECK_INTERVAL = 0.5

# Open live tails, closed on shutdown so their handlers return instead of waiting for lines forever.
LIVE_TAILS: web.AppKey[set[LogSubscription]] = web.AppKey("llmswap_live_tails", set)


def setup(app: web.Application) -> None:
    app[LIVE_TAILS] = set()
    app.router.add_get("/logs", history)
    app.router.add_get("/logs/stream", stream)
    app.router.add_get("/logs/stream/{log_id:.+}", stream)
    app.on_shutdown.append(_end_live_tails)


def rings_for(server: ServerState, log_id: str) -> list[LogRing] | None:
    """The rings a log id names, or None when it names none."""
    if log_id == "":
        return [server.proxy_log, server.upstream_log]
    if log_id == "proxy":
        return [server.proxy_log]
    if log_id == "upstream":
        return [server.upstream_log]
    model_id = server.config.real_model_name(log_id)
    ring = server.model_log(model_id) if model_id is not None else None
    return [ring] if ring is not None else None


def merged_history(rings: Sequence[LogRing]) -> list[str]:
    """Every ring's lines, oldest first; lines with the same time keep their ring's order."""
    entries: list[LogEntry] = []
    for ring in rings:
        entries.extend(ring.entries())
    entries.sort(key=lambda entry: entry.timestamp)  # stable: equal times keep their ring order
    return [entry.line for entry in entries]


def as_text(lines: Sequence[str]) -> bytes:
    return "".join(f"{line}\n" for line in lines).encode("utf-8", errors="replace")


async def history(request: web.Request) -> web.Response:
    if "text/html" in request.headers.get("Accept", ""):
        raise web.HTTPFound("/ui/")
    server = state(request)
    body = as_text(merged_history([server.proxy_log, server.upstream_log]))
    return web.Response(body=body, content_type="text/plain", charset="utf-8")


async def stream(request: web.Request) -> web.StreamResponse:
    server = state(request)
    rings = rings_for(server, request.match_info.get("log_id", ""))
    if rings is None:
        return error_response(request, 400, INVALID_LOGGER)
    live = request.app[LIVE_TAILS]
    subscriptions = [ring.subscribe() for ring in rings]
    live.update(subscriptions)
    try:
        past = [] if "no-history" in request.query else merged_history(rings)
        response = web.StreamResponse(headers={
            "Content-Type": "text/plain; charset=utf-8",
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",  # a buffering reverse proxy in front would hold the tail back
        })
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            if past:
                await response.write(as_text(past))
            async with contextlib.aclosing(_tail(request, subscriptions)) as lines:
                async for line in lines:
                    await response.write(as_text([line]))
            await response.write_eof()
        except ConnectionError:
            log.debug("log stream: the client left")
        return response
    finally:
        for subscription in subscriptions:
            subscription.close()
            live.discard(subscription)


async def _tail(request: web.Request, subscriptions: Sequence[LogSubscription]
                ) -> AsyncGenerator[str, None]:
    """New lines from every subscription, in arrival order, until all are closed or the client leaves.

    aiohttp does not cancel a handler whose client left, so a quiet stream looks at the connection
    every `CLIENT_CHECK_INTERVAL` to end instead of waiting for a line that may never come.
    """
    pending: dict[asyncio.Task[str], LogSubscription] = {}
    try:
        for subscription in subscriptions:
            pending[asyncio.ensure_future(anext(subscription))] = subscription
        while pending:
            done, _ = await asyncio.wait(pending, timeout=CLIENT_CHECK_INTERVAL,
                                         return_when=asyncio.FIRST_COMPLETED)
            for task in _in_start_order(done, pending):
                subscription = pending.pop(task)
                try:
                    line = task.result()
                except StopAsyncIteration:
                    continue  # closed: the server is shutting down
                yield line
                pending[asyncio.ensure_future(anext(subscription))] = subscription
            if _client_left(request):
                return
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def _in_start_order(
    done: set[asyncio.Task[str]], pending: dict[asyncio.Task[str], LogSubscription]
) -> list[asyncio.Task[str]]:
    return [task for task in pending if task in done]


def _client_left(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def _end_live_tails(app: web.Application) -> None:
    tails = app[LIVE_TAILS]
    for subscription in list(tails):
        subscription.close()
