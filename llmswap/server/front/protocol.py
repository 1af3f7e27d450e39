"""One client connection on the front: parse with httptools, serve the fast requests in order, hand the
connection to aiohttp at the first request that is not one.

The bytes of the connection are kept from the start of the oldest request not yet answered, so a hand-over
gives aiohttp that request's raw bytes and everything after them, exactly as the client sent them; from
then on the connection is aiohttp's (`Front.hand_over`). A request can only be fast with a Content-Length
body and a plain CRLF head, so where each one ends is known without a second parser.

Connection-level behaviour matches `llmswap.server.connections` for the requests the front keeps: a
complete request head within `clientHeaderTimeout` of opening (or of the previous answer), anything the
parser refuses handed to aiohttp (which answers 400/431 in the error envelope), `Connection: close` once
a stop began. Requests are answered one after the other (pipelined ones wait, reading pauses when they
pile up); reading otherwise stays on, so a client that hangs up is seen at once (`connection_lost`
cancels the request it was waiting for). Writing respects the transport's flow control.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httptools
from aiohttp import web

from llmswap.server.front.request import FastPlan, FrontRequest, fast_plan, header_multidict
from llmswap.server.inference import InferenceRoute

log = logging.getLogger("llmswap.server")

FAST_BODY_LIMIT = 1024 * 1024  # bytes: a larger body goes to aiohttp, which streams it in
READ_BACKLOG_LIMIT = 256 * 1024  # bytes of unanswered pipelined requests before reading pauses
_NOT_FAST_HEADERS = frozenset({"transfer-encoding", "expect", "upgrade", "content-encoding"})


class Front(Protocol):
    """What the connections of one listener share (`llmswap.server.front.site.Front`)."""

    app: web.Application
    routes: Mapping[str, InferenceRoute]

    def header_timeout(self) -> float: ...

    def held(self, connection: FrontConnection) -> None: ...

    def released(self, connection: FrontConnection) -> None: ...

    def serve(self, connection: FrontConnection, request: FrontRequest, plan: FastPlan
              ) -> Coroutine[Any, Any, None]: ...

    def hand_over(self, transport: asyncio.Transport, rest: bytes, *, write_paused: bool) -> None: ...


@dataclass(slots=True)
class _Message:
    start: int  # stream offset of its first byte
    url: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)  # read from the head once it is whole
    body: bytearray = field(default_factory=bytearray)
    head_length: int = 0
    route_path: str = ""


class FrontConnection(asyncio.Protocol):
    def __init__(self, front: Front) -> None:
        self.front = front
        self.transport: asyncio.Transport | None = None
        # The loop, read once: asyncio.get_running_loop() asks the OS for the process id on every call.
        self.loop = asyncio.get_running_loop()
        self.remote: str | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._buffer = bytearray()
        self._origin = 0  # stream offset of _buffer[0]
        self._next_start = 0  # stream offset where the next request begins
        self._message: _Message | None = None
        self._waiting: deque[tuple[_Message, FrontRequest, FastPlan]] = deque()
        self._hand_over_at: int | None = None  # stream offset of the first request aiohttp answers
        self.serving: asyncio.Task[None] | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_due: float | None = None  # loop time by which a complete request head must be in
        self._head_timeout = 0.0
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._reading_paused = False
        self.closing = False  # no next request: close once the current answer is out
        self.gone = False  # the client's connection is closed

    # ---------------------------------------------------------------------------- the transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport (uvloop's is no subclass)
        peer = transport.get_extra_info("peername")
        self.remote = str(peer[0]) if isinstance(peer, (tuple, list)) and peer else None
        self.front.held(self)
        self._arm_head_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.gone = True
        self._stop_head_timer()
        self.front.released(self)
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(ConnectionResetError("the client closed the connection"))
        if self.serving is not None and not self.serving.done():
            self.serving.cancel()  # the request leaves the queue, or its upstream call is closed
        self._waiting.clear()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._hand_over_at is None:
            try:
                self._parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                self._hand_over_from_current()
            except httptools.HttpParserCallbackError as exc:
                # A bug in deciding about a request (the parser only wraps what a callback raised): aiohttp
                # answers the request instead, and the log keeps what went wrong.
                log.error("front: handing a request from %s to aiohttp after an error", self.remote,
                          exc_info=exc.__context__ or exc)
                self._hand_over_from_current()
            except httptools.HttpParserError:
                self._hand_over_from_current()  # aiohttp's parser refuses it the way clients know
        if not self._reading_paused and len(self._buffer) > READ_BACKLOG_LIMIT and self.serving is not None:
            self._reading_paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]
        self._next()

    @property
    def write_paused(self) -> bool:
        """Whether the transport's buffer is over its high-water mark (the client reads slower)."""
        return self._write_paused

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    async def drain(self) -> None:
        """Wait until the transport takes more; ConnectionResetError once the client is gone."""
        if self.gone:
            raise ConnectionResetError("the client closed the connection")
        if self._write_paused:
            self._drained = self.loop.create_future()
            await self._drained

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self.gone:
            self.transport.write(data)  # type: ignore[union-attr]

    def cut(self) -> None:
        """Close the connection now (an answer that cannot end cleanly must not look complete)."""
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    # ---------------------------------------------------------------------------- the parser's callbacks

    def on_message_begin(self) -> None:
        start = self._next_start
        at = start - self._origin
        while self._buffer[at:at + 2] == b"\r\n":  # a stray CRLF between requests belongs to none
            at += 2
        self._message = _Message(self._origin + at)

    def on_url(self, url: bytes) -> None:
        if self._message is not None:
            self._message.url += url

    def on_headers_complete(self) -> None:
        message = self._message
        if message is None or self._hand_over_at is not None:
            return
        self._disarm_head_timer()
        if not self._fast_shape(message):
            self._hand_over_at = message.start

    def on_body(self, body: bytes) -> None:
        if self._message is not None and self._hand_over_at is None:
            self._message.body += body

    def on_message_complete(self) -> None:
        message, self._message = self._message, None
        if message is None or self._hand_over_at is not None:
            return
        self._next_start = message.start + message.head_length + len(message.body)
        path = message.route_path
        route = self.front.routes[path]
        request = FrontRequest("POST", path, header_multidict(message.headers), self.remote, self.front.app,
                               self.transport, self._parser.should_keep_alive())
        plan = fast_plan(request, route, message.body)
        if plan is None:
            self._hand_over_at = message.start
            return
        self._waiting.append((message, request, plan))

    def _fast_shape(self, message: _Message) -> bool:
        """Whether the head allows the fast path: an HTTP/1.1 POST to an inference route with a modest
        Content-Length body and nothing that changes how the body or the connection is read."""
        parser = self._parser
        if parser.get_method() != b"POST" or parser.get_http_version() != "1.1" or parser.should_upgrade():
            return False
        path = message.url.decode("latin-1")
        if path not in self.front.routes:
            return False  # a query string or any other route
        at = message.start - self._origin
        end = self._buffer.find(b"\r\n\r\n", at)
        if end < 0:
            return False
        head = self._buffer[at:end + 4]
        if head.count(b"\n") != head.count(b"\r\n"):
            return False  # a bare LF somewhere: where the head ends is the parser's business
        # The headers, read here from the whole head (the parser has accepted it) rather than one parser
        # callback per header: latin-1, as HTTP/1.1 headers are octets.
        headers = message.headers
        length = -1
        for line in head[:-4].decode("latin-1").split("\r\n")[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name[0] in " \t" or name[-1] in " \t":
                return False  # a folded or odd line: aiohttp's parser decides what it means
            lower = name.lower()
            if lower in _NOT_FAST_HEADERS:
                return False
            value = value.strip(" \t")
            if lower == "content-length":
                if length >= 0 or not (value.isascii() and value.isdigit()):
                    return False
                length = int(value)
            headers.append((name, value))
        if not 0 < length <= FAST_BODY_LIMIT:
            return False
        message.head_length = end + 4 - at
        message.route_path = path
        return True

    # ---------------------------------------------------------------------------- one request after another

    def _next(self) -> None:
        if self.serving is not None or self.gone:
            return
        if self._waiting:
            message, request, plan = self._waiting.popleft()
            self.serving = self.loop.create_task(self.front.serve(self, request, plan))
            self.serving.add_done_callback(lambda _: self._answered(message))
        elif self._hand_over_at is not None:
            if self.closing:
                self.cut()
            else:
                self._hand_over()

    def _answered(self, message: _Message) -> None:
        self.serving = None
        if self.gone:
            return
        end = message.start + message.head_length + len(message.body)
        del self._buffer[:end - self._origin]
        self._origin = end
        if self.closing:
            self.cut()
            return
        if self._reading_paused and len(self._buffer) <= READ_BACKLOG_LIMIT:
            self._reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        if not self._waiting and self._hand_over_at is None and (
                self._message is None or not self._message.head_length):
            self._arm_head_timer()  # the next head is bounded like the first
        self._next()

    def move_on(self) -> None:
        """Give the connection to the front's next owner (`Front.hand_over`) at the next request boundary:
        now when nothing is being answered, else once the current answer is out. Requests read but not
        answered yet go with it, as bytes."""
        if self.gone or self._hand_over_at is not None:
            return
        if self._waiting:
            self._hand_over_at = self._waiting[0][0].start
            self._waiting.clear()
        else:
            self._hand_over_at = self._message.start if self._message is not None else self._next_start
        self._next()

    def close_if_idle(self) -> None:
        """The server stops: close now when nothing is being answered, else after the current answer."""
        self.closing = True
        if self.serving is None:
            self.cut()

    async def shutdown(self, grace: float | None) -> None:
        """Let the request being answered finish within `grace` seconds, then cut it."""
        self.closing = True
        task = self.serving
        if task is not None and not task.done():
            done, _ = await asyncio.wait({task}, timeout=grace)
            if not done:
                task.cancel()
                await asyncio.wait({task})
        self.cut()

    # ---------------------------------------------------------------------------- hand-over, timeouts

    def _hand_over_from_current(self) -> None:
        if self._hand_over_at is None:
            self._hand_over_at = self._message.start if self._message is not None else self._next_start

    def _hand_over(self) -> None:
        assert self._hand_over_at is not None and self.transport is not None
        rest = bytes(self._buffer[self._hand_over_at - self._origin:])
        self._buffer = bytearray()
        self._stop_head_timer()
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()
        self.front.released(self)
        self.front.hand_over(self.transport, rest, write_paused=self._write_paused)

    def _arm_head_timer(self) -> None:
        # One timer per connection, moved rather than replaced: a keep-alive connection answering thousands
        # of requests a second would otherwise schedule and cancel a timer for each.
        timeout = self.front.header_timeout()
        if timeout <= 0:
            return
        loop = self.loop
        self._head_due = loop.time() + timeout
        self._head_timeout = timeout
        if self._head_timer is None:
            self._head_timer = loop.call_at(self._head_due, self._head_overdue)

    def _disarm_head_timer(self) -> None:
        self._head_due = None  # the timer, when it fires, finds nothing due and goes away

    def _stop_head_timer(self) -> None:
        self._head_due = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_overdue(self) -> None:
        self._head_timer = None
        due = self._head_due
        if due is None or self.gone:
            return
        loop = self.loop
        if loop.time() < due:
            self._head_timer = loop.call_at(due, self._head_overdue)
            return
        if self.serving is None and not self._waiting and self._hand_over_at is None:
            log.debug("closing a connection from %s: no complete request within %gs (clientHeaderTimeout)",
                      self.remote, self._head_timeout)
            self.cut()
