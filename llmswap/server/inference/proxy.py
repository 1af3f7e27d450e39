"""Forwarding one HTTP request to an upstream and relaying its answer as it arrives.

Owns the server's handle on the upstream pool (`llmswap.upstream.pool`), `forward` (the request out, the
response back, byte for byte and unbuffered), and what a client sees when the upstream fails before or
during the answer. (A client that hangs up cancels its handler: `connections.cancel_on_hangup`.)
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Collection, Mapping

from aiohttp import hdrs, web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from llmswap.activity.recording import Recording
from llmswap.server.http.errors import error_body, error_response
from llmswap.server.http.middleware import note_answering
from llmswap.server.inference.inflight import note_relayed
from llmswap.server.inference.watchdog import Watchdog, WatchdogExpired
from llmswap.upstream import Dispatcher, UpstreamPool
from llmswap.upstream.pool import Body, Upstream, UpstreamResponse, send

log = logging.getLogger("llmswap.proxy")

# Headers that describe one connection, not the message (RFC 9110 7.6.1), never forwarded either way.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Recomputed by the upstream client from the body actually sent; `Expect: 100-continue` is answered by
# llmswap, which already holds the whole body, so passing it on would only add a round trip.
_REQUEST_ONLY_LOCAL = frozenset({"content-length", "expect"})
# aiohttp's server decodes a request body in these encodings before any route reads it: the body that goes
# on is the decoded one, so the header that described the encoding stays behind.
DECODED_REQUEST_ENCODINGS = frozenset({"gzip", "deflate", "br", "zstd"})
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away first", for the access log
_ERROR_BODY_LIMIT = 64 * 1024

UPSTREAMS: web.AppKey[UpstreamPool] = web.AppKey("llmswap_upstreams", UpstreamPool)
DISPATCHER: web.AppKey[Dispatcher] = web.AppKey("llmswap_dispatcher", Dispatcher)

SseErrorFormatter = Callable[[int, str], bytes]


def openai_sse_error(status: int, message: str) -> bytes:
    """An error inside an OpenAI-style event stream: the error envelope as one event, then `[DONE]`."""
    return b"data: " + error_body(status, message) + b"\n\ndata: [DONE]\n\n"


async def close_upstream_pool(app: web.Application) -> None:
    """`on_cleanup` hook: close every upstream connection."""
    await app[UPSTREAMS].close()


# -------------------------------------------------------------------------------- forwarding


def upstream_url(base_url: str, path: str, raw_query: str) -> URL:
    """`base_url` (its own path is a prefix) + `path` (sent as given, already percent-encoded) + query."""
    base = base_url.rstrip("/")
    if path and not path.startswith("/"):
        path = "/" + path
    text = base + path + (f"?{raw_query}" if raw_query else "")
    return URL(text, encoded=True)


def outgoing_headers(
    request: web.BaseRequest,
    extra_headers: Mapping[str, str] | None = None,
    drop_headers: Collection[str] = (),
) -> CIMultiDict[str]:
    """The client's headers minus the hop-by-hop ones (and those its Connection header names) and
    `drop_headers`, plus the client's address in X-Forwarded-For, then `extra_headers` (which replace any
    header of the same name)."""
    listed = _connection_listed(request.headers)
    if drop_headers:
        listed |= {name.lower() for name in drop_headers}
    kept = []
    for name, value in request.headers.items():
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in listed or lower in _REQUEST_ONLY_LOCAL:
            continue
        if lower == "content-encoding" and value.strip().lower() in DECODED_REQUEST_ENCODINGS:
            continue
        kept.append((name, value))
    headers: CIMultiDict[str] = CIMultiDict(kept)
    if request.remote:
        prior = ", ".join(headers.popall("X-Forwarded-For", ()))
        headers["X-Forwarded-For"] = f"{prior}, {request.remote}" if prior else request.remote
    for name, value in (extra_headers or {}).items():
        headers[name] = value
    return headers


def relayed_headers(upstream: UpstreamResponse) -> CIMultiDict[str]:
    """The upstream's response headers to pass on: all but hop-by-hop ones and those its Connection names."""
    listed = _connection_listed(upstream.headers)
    return CIMultiDict([(name, value) for name, value in upstream.headers.items()
                        if name.lower() not in HOP_BY_HOP and name.lower() not in listed])


_NOTHING_LISTED: frozenset[str] = frozenset()


def _connection_listed(headers: CIMultiDictProxy[str]) -> frozenset[str]:
    """The header names a message's Connection header lists (hop-by-hop for that message)."""
    values = headers.getall(hdrs.CONNECTION, ())
    if not values:
        return _NOTHING_LISTED
    return frozenset(token.strip().lower() for value in values for token in value.split(","))


def is_event_stream(content_type: str) -> bool:
    return "text/event-stream" in content_type.lower()


def describe(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


async def forward(
    request: web.Request,
    *,
    base_url: str,
    path: str,
    upstream: Upstream,
    body: Body | None = None,
    extra_headers: Mapping[str, str] | None = None,
    response: web.StreamResponse | None = None,
    query: str | None = None,
    drop_headers: Collection[str] = (),
    response_header_timeout: float = 0.0,
    error_prefix: str = "upstream proxy error",
    sse_error: SseErrorFormatter = openai_sse_error,
    watchdog: Watchdog | None = None,
    recording: Recording | None = None,
) -> web.StreamResponse:
    """Send `request` to `base_url` + `path` and relay the answer as it arrives.

    The method, the headers (see `outgoing_headers`) and the body (the client's bytes when `body` is None)
    go out; the status, headers and body come back unbuffered, event streams with `X-Accel-Buffering: no`.
    `query` replaces the client's raw query string; `drop_headers` are not forwarded. An upstream that
    cannot be reached (or sends no headers within `response_header_timeout` s, 0 = no limit) → 502 in the
    error envelope, `error_prefix: why`.
    An upstream that fails mid-answer ends an event stream with `sse_error`, any other body with a cut
    connection (never a complete-looking truncated body). A client that leaves closes the upstream request.

    `response` is a response already sent to the client (a loading stream's 200): the upstream's body is
    written into it; its status and headers are lost, and an upstream error becomes an `sse_error` event.
    `watchdog` bounds the whole answer and the gaps between its bytes
    (`llmswap.server.inference.watchdog`): 504.
    `recording` (activity) is told the body sent, the upstream's status and headers, each chunk relayed.
    """
    headers = outgoing_headers(request, extra_headers, drop_headers)
    if body is None:
        body = await request.read() if request.body_exists else None
    if recording is not None and recording.wants_request_body and body is not None:
        recording.request_body(body)
    url = upstream_url(base_url, path, request.rel_url.raw_query_string if query is None else query)
    try:
        sending = send(upstream, request.method, url, headers, body, response_header_timeout)
        answer = await (watchdog.guard(sending) if watchdog is not None else sending)
    except (OSError, TimeoutError, ValueError) as exc:
        if isinstance(exc, WatchdogExpired):
            log.warning("%s %s → %s: %s", request.method, request.path, url, exc.message)
            if response is not None and response.prepared:
                await _write_quietly(response, sse_error(504, exc.message))
                return response
            return error_response(request, 504, exc.message)
        if isinstance(exc, TimeoutError):
            why = f"no response headers within {response_header_timeout:g}s"
        else:
            why = describe(exc)
        log.warning("%s %s → %s: %s", request.method, request.path, url, why)
        message = f"{error_prefix}: {why}"
        if recording is not None:
            recording.fail(502, message)
        if response is not None and response.prepared:
            await _write_quietly(response, sse_error(502, message))
            return response
        return error_response(request, 502, message)
    completed = False
    if recording is not None:
        recording.response_headers(answer.status, answer.headers)
    try:
        if response is not None and response.prepared:
            if answer.status >= 400:
                await _relay_error_into_stream(response, answer, sse_error, recording)
                completed = True
                return response
        else:
            response = web.StreamResponse(status=answer.status, reason=answer.reason)
            response.headers.extend(relayed_headers(answer))
            if is_event_stream(answer.headers.get(hdrs.CONTENT_TYPE, "")):
                response.headers["X-Accel-Buffering"] = "no"
            await response.prepare(request)
            note_answering(request)
        completed = await _relay_body(request, response, answer, error_prefix, sse_error, watchdog,
                                      recording)
        return response
    except ConnectionResetError:
        # The client left while the answer streamed: closing the upstream request below is what stops the
        # upstream generating for nobody.
        log.debug("%s %s: the client disconnected mid-response", request.method, request.path)
        return response if response is not None else web.Response(status=CLIENT_CLOSED_REQUEST)
    finally:
        # An answer not relayed whole (the client left, a cancel, a preemption) closes its connection:
        # that is what tells the upstream to stop generating.
        if completed:
            answer.release()
        else:
            answer.close()


async def _relay_body(
    request: web.Request,
    response: web.StreamResponse,
    upstream: UpstreamResponse,
    error_prefix: str,
    sse_error: SseErrorFormatter,
    watchdog: Watchdog | None,
    recording: Recording | None,
) -> bool:
    """Copy the upstream body to the client as it arrives; True when it arrived whole."""
    while True:
        try:
            reading = upstream.read_chunk()
            chunk = await (watchdog.guard(reading) if watchdog is not None else reading)
        except WatchdogExpired as exc:
            await _upstream_broke(request, response, exc.message, sse_error, status=504)
            return False
        except (OSError, TimeoutError) as exc:
            message = f"{error_prefix}: the upstream broke off its answer ({describe(exc)})"
            if recording is not None:
                recording.fail(502, message)
            await _upstream_broke(request, response, message, sse_error)
            return False
        if not chunk:
            break
        await response.write(chunk)
        note_relayed(request, len(chunk))
        if recording is not None:
            recording.chunk(chunk)
    await response.write_eof()
    return True


async def _upstream_broke(
    request: web.Request, response: web.StreamResponse, message: str, sse_error: SseErrorFormatter,
    status: int = 502,
) -> None:
    log.warning("%s %s: %s", request.method, request.path, message)
    if is_event_stream(response.headers.get(hdrs.CONTENT_TYPE, "")):
        await _write_quietly(response, sse_error(status, message))
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return
    # Any other body cannot carry an error; ending it normally would pass a truncated answer off as
    # complete, so the connection is cut instead.
    transport = request.transport
    if transport is not None:
        transport.close()


async def _relay_error_into_stream(
    response: web.StreamResponse, upstream: UpstreamResponse, sse_error: SseErrorFormatter,
    recording: Recording | None,
) -> None:
    raw = (await upstream.read(_ERROR_BODY_LIMIT))[:_ERROR_BODY_LIMIT]
    if recording is not None:
        recording.chunk(raw)
    text = raw.decode("utf-8", errors="replace").strip()
    answered = f"the upstream answered {upstream.status} {upstream.reason or ''}".strip()
    message = _error_message(text) or answered
    await _write_quietly(response, sse_error(upstream.status, message))
    with contextlib.suppress(ConnectionError):
        await response.write_eof()


def _error_message(text: str) -> str:
    try:
        document = json.loads(text)
    except ValueError:
        return text
    if isinstance(document, dict):
        error = document.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if isinstance(document.get("message"), str):
            return str(document["message"])
    return text


async def _write_quietly(response: web.StreamResponse, data: bytes) -> None:
    with contextlib.suppress(ConnectionError):
        await response.write(data)
