"""The upstream side of a fast request: the request out on the lease's connection pool, the answer relayed
to the client as it arrives, with the model's timeouts (`responseHeader`, the `Watchdog`).

What the client sees when the upstream fails is `llmswap.server.proxy.forward`'s: 502 (or 504 for a
watchdog) in the error envelope before any byte; once the answer started, an error event at the end of an
event stream, a cut connection for any other body (never a truncated answer passed off as complete).
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple, Protocol

from aiohttp import hdrs, web

from llmswap.activity.recording import Recording
from llmswap.dispatch.dispatcher import Lease
from llmswap.dispatch.pool import send
from llmswap.server.errors import error_response
from llmswap.server.front.request import FastPlan, FrontRequest
from llmswap.server.front.wire import BodyWriter, Wire, prepared_head, send_whole
from llmswap.server.inflight import InflightEntry
from llmswap.server.loading import dialect_for
from llmswap.server.middleware import AccessRecord
from llmswap.server.proxy import describe, is_event_stream, outgoing_headers, relayed_headers, upstream_url
from llmswap.server.watchdog import Watchdog, WatchdogExpired

log = logging.getLogger("llmswap.proxy")

ERROR_PREFIX = "upstream proxy error"


class Connection(Wire, Protocol):
    """The client's connection: a `Wire` that can also be cut."""

    def cut(self) -> None: ...


class Served(NamedTuple):
    """What the front keeps of one request it serves: its access record, its recording, its in-flight entry
    (the relay tells all three what went out)."""

    record: AccessRecord
    recording: Recording
    entry: InflightEntry


async def relay(conn: Connection, request: FrontRequest, plan: FastPlan, lease: Lease, served: Served
                ) -> web.StreamResponse:
    """Send the planned request to the leased model and relay its answer; the response as sent."""
    recording = served.recording
    headers = outgoing_headers(request)  # type: ignore[arg-type]  # reads headers and remote only
    body = plan.body
    if recording.wants_request_body:
        recording.request_body(body if isinstance(body, (bytes, bytearray)) else b"".join(body.parts))
    url = upstream_url(lease.config.proxy, plan.route.upstream_path, "")
    watchdog = Watchdog.of(f"models.{lease.config.id}.timeouts", lease.config.timeouts)
    timeout = lease.response_header_timeout
    try:
        sending = send(lease.upstream, "POST", url, headers, body, timeout)
        upstream = await (watchdog.guard(sending) if watchdog is not None else sending)
    except (OSError, TimeoutError, ValueError) as exc:
        if isinstance(exc, WatchdogExpired):
            log.warning("POST %s → %s: %s", request.path, url, exc.message)
            return await send_whole(request, error_response(request, 504, exc.message), conn)  # type: ignore[arg-type]
        why = f"no response headers within {timeout:g}s" if isinstance(exc, TimeoutError) else describe(exc)
        log.warning("POST %s → %s: %s", request.path, url, why)
        message = f"{ERROR_PREFIX}: {why}"
        recording.fail(502, message)
        return await send_whole(request, error_response(request, 502, message), conn)  # type: ignore[arg-type]
    completed = False
    recording.response_headers(upstream.status, upstream.headers)
    try:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        response.headers.extend(relayed_headers(upstream))
        if is_event_stream(upstream.headers.get(hdrs.CONTENT_TYPE, "")):
            response.headers["X-Accel-Buffering"] = "no"
        head, chunked = await prepared_head(request, response, conn)
        writer = BodyWriter(conn, head, chunked)
        record, entry = served.record, served.entry
        record.answering = True  # the head is as good as sent: no other answer
        while True:
            try:
                reading = upstream.read_chunk()
                chunk = await (watchdog.guard(reading) if watchdog is not None else reading)
            except WatchdogExpired as exc:
                await _broke(conn, request, plan, response, writer, exc.message, 504)
                return response
            except (OSError, TimeoutError) as exc:
                message = f"{ERROR_PREFIX}: the upstream broke off its answer ({describe(exc)})"
                recording.fail(502, message)
                await _broke(conn, request, plan, response, writer, message, 502)
                return response
            if not chunk:
                break
            await writer.write(chunk)
            if record.first_byte is None:
                record.first_byte = time.monotonic() - record.started
            entry.resp_bytes += len(chunk)
            recording.chunk(chunk)
        writer.end()
        completed = True
        return response
    finally:
        if completed:
            upstream.release()
        else:
            upstream.close()  # closing the upstream request stops it generating for nobody


async def _broke(conn: Connection, request: FrontRequest, plan: FastPlan, response: web.StreamResponse,
                 writer: BodyWriter, message: str, status: int) -> None:
    log.warning("POST %s: %s", request.path, message)
    if writer.chunked and is_event_stream(response.headers.get(hdrs.CONTENT_TYPE, "")):
        try:
            await writer.write(dialect_for(plan.route.path).error(status, message))
            writer.end()
            return
        except ConnectionError:
            pass
    conn.cut()
