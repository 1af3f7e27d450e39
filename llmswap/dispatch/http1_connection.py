"""One keep-alive HTTP/1.1 connection to an upstream: an asyncio protocol fed to httptools' C parser.

Owns the state of the one exchange in progress on a connection (the answer's head, its body chunks waiting
for the reader, back-pressure on the socket, the end of the answer or how it broke) and the errors a broken
exchange raises. Pooling, sending and the reader's side are `llmswap.dispatch.http1`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

HIGH_WATER = 256 * 1024  # body bytes waiting for the reader at which reading the upstream pauses

Origin = tuple[str, str, int]  # scheme, host, port


class UpstreamClosed(ConnectionError):
    """The upstream closed the connection before its answer was complete."""


class UpstreamProtocolError(ConnectionError):
    """The upstream's bytes are not an HTTP/1.1 answer."""


class ConnectFailed(ConnectionError):
    """No connection to the upstream (refused, unresolvable, a failed TLS handshake...)."""


class ConnectTimeout(ConnectFailed):
    """No connection to the upstream within `timeouts.connect`."""


class Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its answer parsed as it arrives."""

    def __init__(self, origin: Origin, on_lost: Callable[[Connection], None]) -> None:
        self.origin = origin
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        # The loop, read once: asyncio.get_running_loop() asks the OS for the process id on every call.
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpResponseParser(self)
        self.served = 0  # answers completed on it
        self.lost = False
        self.idle_since = 0.0  # loop time it went back to the pool
        # The exchange in progress (`busy`).
        self.busy = False
        self.head: asyncio.Future[None] | None = None  # done when the answer's headers are in
        self.head_only = False  # answering HEAD: no body follows, whatever the headers say
        self.informational = False  # a 1xx answer before the real one
        self.status = 0
        self.reason = b""
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.headers: CIMultiDictProxy[str] | None = None
        self.until_close = False  # a body delimited by the end of the connection
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.paused = False
        self.done = False  # the whole answer arrived
        self.keep_alive = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None

    # ---------------------------------------------------------------- transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport (uvloop's is no subclass)

    def data_received(self, data: bytes) -> None:
        if not self.busy:  # bytes nobody asked for: this connection can no longer be trusted
            self.abort()
            return
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:  # nobody asked to upgrade
            self._fail(UpstreamProtocolError(f"the upstream's answer is not valid HTTP/1.1 ({exc})"))
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.on_lost(self)
        if not self.busy or self.done:
            return
        if self.head is not None and not self.head.done():
            why = f" ({exc})" if exc else ""
            self._fail(UpstreamClosed(f"the upstream closed the connection before answering{why}"))
        elif self.until_close and exc is None:
            self.done = True  # the end of the connection is the end of this body
            self._wake()
        else:
            self._fail(UpstreamClosed("the upstream closed the connection mid-answer"))

    # ---------------------------------------------------------------- parser callbacks (httptools)

    # An answer the upstream sends after the one asked for (`done`) is ignored and ends the connection.

    def on_message_begin(self) -> None:
        if self.done:
            self.keep_alive = False
            return
        self.reason = b""
        self.raw_headers = []

    def on_status(self, reason: bytes) -> None:
        if not self.done:
            self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.done:
            self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.done:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            self.informational = True  # llhttp goes on to parse the final answer after it
            return
        self.status = status
        headers: CIMultiDict[str] = CIMultiDict([
            (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
            for name, value in self.raw_headers
        ])
        self.headers = CIMultiDictProxy(headers)
        framed = "content-length" in headers or "chunked" in headers.get("transfer-encoding", "").lower()
        self.until_close = not framed and status not in (204, 304)
        if self.head_only:
            # The parser would wait for a body the Content-Length announces: the answer is complete here,
            # and the connection cannot be reused.
            self.done = True
            self.keep_alive = False
        head = self.head
        if head is not None and not head.done():
            head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.head_only or self.done:
            return
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered >= HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.done:
            return
        if self.informational:
            self.informational = False
            return
        if not self.head_only:
            self.done = True
            self.keep_alive = self.parser.should_keep_alive()
        self._wake()

    # ---------------------------------------------------------------- exchange

    def begin(self, head_only: bool) -> asyncio.Future[None]:
        self.busy = True
        self.head_only = head_only
        self.informational = False
        self.status = 0
        self.headers = None
        self.until_close = False
        self.chunks = []
        self.buffered = 0
        self.done = False
        self.keep_alive = False
        self.error = None
        self.head = self.loop.create_future()
        return self.head

    def take(self) -> bytes:
        chunks = self.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = []
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    def reusable(self) -> bool:
        return self.done and self.keep_alive and not self.lost and self.error is None and not self.chunks

    def finish(self) -> None:
        """The exchange is over and its answer read whole: ready for the next request."""
        self.busy = False
        self.served += 1
        self.head = None
        self.waiter = None

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, error: BaseException) -> None:
        self.error = error
        head = self.head
        if head is not None and not head.done():
            head.set_exception(error)
            head.exception()  # retrieved: a caller already gone must not leave an unretrieved-exception log
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)
