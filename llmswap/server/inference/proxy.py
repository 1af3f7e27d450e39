"""The HTTP side of forwarding: a client's request to an upstream, the answer back to the client.

Owns what goes out of the client's request (`outgoing_headers`, `upstream_url`), what comes back to it
(`relayed_headers`, `ClientSink`) and what the client sees when the upstream fails before or during the
answer; the forwarding itself is `llmswap.upstream.forward`'s. (A client that hangs up cancels its
handler: `connections.cancel_on_hangup`.)
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Collection, Mapping

from aiohttp import hdrs, web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from llmswap.activity.recording import Recording, RequestRecord
from llmswap.server.http.errors import error_body, error_response
from llmswap.upstream import Dispatcher, UpstreamPool
from llmswap.upstream.client import Body
from llmswap.upstream.forward import Buffer, Destination, Unreachable

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


def relayed_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """An upstream answer's headers to pass on: all but hop-by-hop ones and those its Connection names."""
    listed = _connection_listed(headers)
    return CIMultiDict([(name, value) for name, value in headers.items()
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


async def forward(
    request: web.Request,
    destination: Destination,
    *,
    path: str,
    body: Body | None = None,
    extra_headers: Mapping[str, str] | None = None,
    response: web.StreamResponse | None = None,
    query: str | None = None,
    drop_headers: Collection[str] = (),
    error_prefix: str = "upstream proxy error",
    sse_error: SseErrorFormatter = openai_sse_error,
    recording: Recording | None = None,
    record: RequestRecord | None = None,
) -> web.StreamResponse:
    """Send `request` to `destination` + `path` and relay the answer to its client as it arrives (the one
    forwarder, `llmswap.upstream.forward`, into a `ClientSink`, under the destination's timeouts).

    The method, the headers (see `outgoing_headers`) and the body (the client's bytes when `body` is None)
    go out; the status, headers and body come back unbuffered, event streams with `X-Accel-Buffering: no`.
    `query` replaces the client's raw query string; `drop_headers` are not forwarded. An upstream that
    cannot be reached (or sends no headers within its `timeouts.responseHeader`) → 502 in the error
    envelope, `error_prefix: why` (504 when the watchdog stopped it).

    `response` is a response already sent to the client (a loading stream's 200): the upstream's body is
    written into it; its status and headers are lost, and an upstream error becomes an `sse_error` event.
    `recording` (activity) is told what went out and came back; `record` (the request's) when the answer's
    head and each of its bytes went out.
    """
    headers = outgoing_headers(request, extra_headers, drop_headers)
    if body is None:
        body = await request.read() if request.body_exists else None
    raw_query = request.rel_url.raw_query_string if query is None else query
    url = upstream_url(destination.base_url, path, raw_query)
    sink = ClientSink(request, response, sse_error, record if record is not None else RequestRecord())
    try:
        await destination.send(request.method, url, headers, body, sink, recording=recording,
                               error_prefix=error_prefix)
    except Unreachable as exc:
        log.warning("%s %s → %s: %s", request.method, request.path, url, exc.message)
        if response is not None and response.prepared:
            await _write_quietly(response, sse_error(exc.status, exc.message))
            return response
        return error_response(request, exc.status, exc.message)
    except ConnectionResetError:
        # The client left while the answer streamed: the forwarder closed the upstream request, which is
        # what stops the upstream generating for nobody.
        log.debug("%s %s: the client disconnected mid-response", request.method, request.path)
        if recording is not None:
            recording.client_left()
        return sink.response if sink.response is not None else web.Response(status=CLIENT_CLOSED_REQUEST)
    assert sink.response is not None
    return sink.response


class WholeAnswer(web.StreamResponse):
    """The client's response to an answer of known length: its head goes out with the first bytes of its
    body, in one write (aiohttp's own `Response` does the same), instead of one write for the head and one
    for the body. A warm chat completion's answer is one such write: one system call and one wake-up of
    the client fewer per request. An event stream's head still goes out at once (a client waiting for a
    first token learns the status first)."""

    _send_headers_immediately = False  # aiohttp's switch (3.12+: StreamResponse True, Response False)


class ClientSink:
    """The client's side of a forwarded answer: a streaming response made from the upstream's head (or the
    loading stream already sent), and what the client sees when the upstream breaks off."""

    def __init__(self, request: web.Request, response: web.StreamResponse | None,
                 sse_error: SseErrorFormatter, record: RequestRecord) -> None:
        self.request = request
        self.response = response
        self.sse_error = sse_error
        self.record = record
        self._error: Buffer | None = None  # an error answer going into a stream already under way

    async def start(self, status: int, reason: str, headers: CIMultiDictProxy[str]) -> None:
        response = self.response
        if response is not None and response.prepared:
            if status >= 400:  # the stream is a 200 already: the error becomes its last event
                self._error = Buffer(limit=_ERROR_BODY_LIMIT, status=status, reason=reason)
            return
        stream = is_event_stream(headers.get(hdrs.CONTENT_TYPE, ""))
        kind = WholeAnswer if not stream and hdrs.CONTENT_LENGTH in headers else web.StreamResponse
        response = self.response = kind(status=status, reason=reason)
        response.headers.extend(relayed_headers(headers))
        if stream:
            response.headers["X-Accel-Buffering"] = "no"
        await response.prepare(self.request)
        self.record.answering = True

    async def write(self, chunk: bytes) -> None:
        if self._error is not None:
            await self._error.write(chunk)
            return
        assert self.response is not None
        await self.response.write(chunk)
        self.record.relayed(len(chunk))

    async def finish(self) -> None:
        assert self.response is not None
        if self._error is not None:
            text = self._error.body.decode("utf-8", errors="replace").strip()
            answered = f"the upstream answered {self._error.status} {self._error.reason or ''}".strip()
            await _write_quietly(self.response, self.sse_error(self._error.status,
                                                              _error_message(text) or answered))
            with contextlib.suppress(ConnectionError):
                await self.response.write_eof()
            return
        await self.response.write_eof()

    async def broke(self, status: int, message: str) -> None:
        request, response = self.request, self.response
        assert response is not None
        log.warning("%s %s: %s", request.method, request.path, message)
        if is_event_stream(response.headers.get(hdrs.CONTENT_TYPE, "")):
            await _write_quietly(response, self.sse_error(status, message))
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
            return
        # Any other body cannot carry an error; ending it normally would pass a truncated answer off as
        # complete, so the connection is cut instead.
        transport = request.transport
        if transport is not None:
            transport.close()


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
