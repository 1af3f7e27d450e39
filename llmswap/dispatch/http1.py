"""A lean HTTP/1.1 client for upstreams: asyncio protocols, httptools' C parser, keep-alive connections.

Owns `Upstream` (one upstream's idle connections, per origin, and opening new ones) and `UpstreamResponse`
(one answer: status, reason, headers, and its body read chunk by chunk as it arrives); the connection
protocol under both is `llmswap.dispatch.http1_connection`'s.

It does what relaying needs and nothing else: no redirects, no cookies, no decompression (bytes pass as the
upstream encoded them), no headers of its own beyond Host and Content-Length, no total timeout (a long
generation is the model's business); the model's `timeouts` bound connecting, the TLS handshake and how long
a connection may wait idle in the pool. https upstreams get TLS with the system's trust store.

Back-pressure: a body the caller reads slower than the upstream sends pauses reading the socket once
`HIGH_WATER` bytes wait, and resumes when the caller takes them. A response the caller abandons (`close`)
closes its connection, so the upstream sees the socket go and stops generating. Which failed request may go
out again is `llmswap.dispatch.pool`'s decision; the `Attempt` passed in learns what it needs for it.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

from multidict import CIMultiDictProxy
from yarl import URL

from llmswap.config.model import Timeouts
from llmswap.dispatch.http1_connection import (
    ConnectFailed,
    Connection,
    ConnectTimeout,
    Origin,
    UpstreamClosed,
    UpstreamProtocolError,
)

__all__ = ["Attempt", "ConnectFailed", "ConnectTimeout", "Upstream", "UpstreamClosed",
           "UpstreamProtocolError", "UpstreamResponse"]

# Idle keep-alive connections kept per origin; more are closed on release. Above the concurrency clients
# drive (hundreds of connections): a lower cap closes and reopens a connection per request under load.
MAX_IDLE_PER_ORIGIN = 1024
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "CONNECT", "DELETE"})
_LOCAL_HEADERS = frozenset({"host", "content-length", "transfer-encoding"})  # written by the client itself

RequestBody = bytes | bytearray | list[bytes | memoryview]  # the bytes, or the parts of them in order


@dataclass
class Attempt:
    """What one try at sending learned about its connection."""

    reused: bool = False  # the connection came from the pool (it served a request before)
    handed_over: bool = False  # the request was given to the connection's transport to write


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


class UpstreamResponse:
    """One answer from an upstream. Read its body with `read_chunk` (as it arrives) or `read`; then
    `release` it (its connection goes back to the pool when the answer was read whole) or `close` it
    (abandoned: the connection closes, which tells the upstream to stop)."""

    def __init__(self, connection: Connection, upstream: Upstream) -> None:
        self._connection: Connection | None = connection
        self._upstream = upstream
        self.status = connection.status
        self.reason = connection.reason.decode("latin-1")
        assert connection.headers is not None
        self.headers: CIMultiDictProxy[str] = connection.headers

    async def read_chunk(self) -> bytes:
        """The body bytes that arrived since the last call, waiting for some; b"" at the end of the body.
        Raises `UpstreamClosed` / `UpstreamProtocolError` when the upstream broke off."""
        connection = self._connection
        if connection is None:
            return b""
        while not connection.chunks:
            if connection.error is not None:
                raise connection.error
            if connection.done:
                return b""
            connection.waiter = connection.loop.create_future()
            await connection.waiter
        return connection.take()

    async def read(self, limit: int = -1) -> bytes:
        """The body to its end, or its first `limit` bytes and a little more when `limit` >= 0."""
        parts: list[bytes] = []
        size = 0
        while limit < 0 or size < limit:
            chunk = await self.read_chunk()
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
        return b"".join(parts)

    def release(self) -> None:
        """Done with the answer: its connection is reused when the answer was read whole, else closed."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if connection.reusable():
            connection.finish()
            self._upstream._put(connection)
        else:
            connection.abort()

    def close(self) -> None:
        """Abandon the answer: its connection closes (an upstream still generating sees it go)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.abort()

    async def __aenter__(self) -> UpstreamResponse:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self.release()
        else:
            self.close()


class Upstream:
    """Keep-alive connections to one upstream (one model or peer) under one set of `timeouts`."""

    def __init__(self, timeouts: Timeouts) -> None:
        self.timeouts = timeouts
        self._idle: dict[Origin, list[Connection]] = {}
        self._open: set[Connection] = set()
        self._closed = False
        # One timer for the whole pool closes connections idle longer than `idle_conn` (one per
        # connection would cost a timer heap push and cancel per request).
        self._sweep: asyncio.TimerHandle | None = None

    async def request(
        self,
        method: str,
        url: URL,
        headers: Mapping[str, str],
        body: RequestBody | None = None,
        attempt: Attempt | None = None,
    ) -> UpstreamResponse:
        """Send one request and wait for the answer's headers. `body` is the bytes, or the parts of the
        bytes, to send; `headers` the caller's (its Host wins over the URL's; Content-Length is computed)."""
        if self._closed:
            raise UpstreamClosed("the upstream pool is closed (the server is shutting down)")
        head = _request_head(method, url, headers, body)
        origin: Origin = (url.scheme, url.raw_host or "", url.port or 0)
        connection = self._idle_connection(origin) or await self._connect(origin)
        if attempt is not None:
            attempt.reused = connection.served > 0
        try:
            transport = connection.transport
            if transport is None or transport.is_closing():
                raise UpstreamClosed("the pooled connection was closed before the request was sent")
            answered = connection.begin(method.upper() == "HEAD")
            if attempt is not None:
                attempt.handed_over = True
            if body is None:
                transport.write(head)
            elif isinstance(body, list):
                transport.writelines([head, *body])
            else:
                transport.writelines((head, body))
            await answered
        except BaseException:
            connection.abort()  # failed, timed out or abandoned before the answer: never reused
            raise
        return UpstreamResponse(connection, self)

    def _idle_connection(self, origin: Origin) -> Connection | None:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            transport = connection.transport
            if not connection.lost and transport is not None and not transport.is_closing():
                return connection
        return None

    async def _connect(self, origin: Origin) -> Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        tls = _tls_context() if scheme == "https" else None
        limit = self.timeouts.connect

        def protocol() -> Connection:
            return Connection(origin, self._forget)

        try:
            async with asyncio.timeout(limit or None):
                if tls is None:
                    _, connection = await loop.create_connection(protocol, host, port)
                else:
                    _, connection = await loop.create_connection(
                        protocol, host, port, ssl=tls, server_hostname=host,
                        ssl_handshake_timeout=self.timeouts.tls_handshake or None,
                    )
        except TimeoutError as exc:
            raise ConnectTimeout(
                f"could not connect to {host}:{port} within {limit:g}s (timeouts.connect)") from exc
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {host}:{port} ({exc.strerror or exc})") from exc
        if self._closed:
            connection.abort()
            raise UpstreamClosed("the upstream pool is closed (the server is shutting down)")
        self._open.add(connection)
        _keep_alive_probes(connection, self.timeouts.keepalive)
        return connection

    def _put(self, connection: Connection) -> None:
        idle = self._idle.setdefault(connection.origin, [])
        if self._closed or len(idle) >= MAX_IDLE_PER_ORIGIN:
            connection.abort()
            return
        loop = connection.loop
        connection.idle_since = loop.time()
        idle.append(connection)
        if self.timeouts.idle_conn > 0 and self._sweep is None:
            self._sweep = loop.call_later(self.timeouts.idle_conn, self._close_expired)

    def _close_expired(self) -> None:
        """Close the connections idle for `idle_conn` or longer; come back when the next one will be."""
        self._sweep = None
        loop = asyncio.get_running_loop()
        expiry = loop.time() - self.timeouts.idle_conn
        oldest: float | None = None
        for idle in self._idle.values():
            # Each list is in the order connections came back: the expired ones are at its start.
            expired = 0
            while expired < len(idle) and idle[expired].idle_since <= expiry:
                expired += 1
            for connection in idle[:expired]:
                connection.abort()
            del idle[:expired]
            if idle:
                first = idle[0].idle_since
                oldest = first if oldest is None else min(oldest, first)
        if oldest is not None:
            self._sweep = loop.call_at(oldest + self.timeouts.idle_conn, self._close_expired)

    def _forget(self, connection: Connection) -> None:
        """A connection closed (by either side): out of the pool at once."""
        self._open.discard(connection)
        idle = self._idle.get(connection.origin)
        if idle and connection in idle:
            idle.remove(connection)

    def idle_count(self) -> int:
        """Connections waiting in the pool (for tests and introspection)."""
        return sum(len(idle) for idle in self._idle.values())

    def close(self) -> None:
        """Close every connection, idle or busy; later requests fail."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for connection in list(self._open):
            connection.abort()
        self._idle.clear()


def _keep_alive_probes(connection: Connection, seconds: float) -> None:
    """TCP keep-alive probes after `seconds` idle, then every `seconds` (`timeouts.keepalive`, as Go's
    dialer): a peer that vanished without closing is noticed even while nothing is sent."""
    sock = connection.transport.get_extra_info("socket") if connection.transport is not None else None
    if sock is None or seconds <= 0:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option in ("TCP_KEEPIDLE", "TCP_KEEPINTVL"):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), max(1, int(seconds)))


def _request_head(
    method: str, url: URL, headers: Mapping[str, str], body: RequestBody | None) -> bytes:
    lines = [f"{method} {url.raw_path_qs or '/'} HTTP/1.1"]
    host = None
    for name, value in headers.items():
        lower = name.lower()
        if lower in _LOCAL_HEADERS:
            if lower == "host":
                host = value
            continue
        lines.append(f"{name}: {value}")
    if host is None:
        host = url.host_port_subcomponent or url.raw_host or ""
    lines.append(f"Host: {host}")
    if body is not None:
        size = sum(len(part) for part in body) if isinstance(body, list) else len(body)
        lines.append(f"Content-Length: {size}")
    elif method.upper() not in _NO_BODY_METHODS:
        lines.append("Content-Length: 0")
    text = "\r\n".join(lines)
    breaks = len(lines) - 1
    if text.count("\n") != breaks or text.count("\r") != breaks:  # a value ending its line: an injection
        raise ValueError("a request header contains a line break")
    return (text + "\r\n\r\n").encode("utf-8", "surrogateescape")
