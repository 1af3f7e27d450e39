"""The upstream client: aiohttp's, one session per upstream and set of timeouts, its pool, and what its
errors mean.

Owns `UpstreamPool` (one `Upstream` per upstream and set of timeouts), `Upstream` (one upstream's
keep-alive connections: an `aiohttp.ClientSession`), `send` (a request out with the model's response-header
limit), `UpstreamResponse` (one answer: status, reason, headers, and its body read as it arrives), and the
errors a caller sees: every
way an exchange can fail is a `ConnectionError` (`ConnectFailed`, `UpstreamClosed`, `UpstreamProtocolError`)
or a `ConnectTimeout`, so the forwarder handles one family.

Every request to an upstream, whether it came over HTTP, from a task, from a batch or is a websocket
upgrade, goes out through a session of the pool, so all of them get the same transport: the model's
`timeouts` and nothing else.

What the session is set to do is what relaying needs: no redirects, no cookies, no decompression (bytes
pass as the upstream encoded them), no headers of its own (the caller's go out, with Host and
Content-Length), no total timeout (a long generation is the model's business). The model's `timeouts` bound
connecting and the TLS handshake; aiohttp's reader pauses the socket when the caller reads slower than the
upstream sends. A response the caller abandons (`close`) closes its connection, so the upstream sees it go.

aiohttp never sends a POST twice by itself: a pooled connection the upstream closed just as it was reused
fails the request. The pool therefore keeps idle connections for at most `MAX_IDLE`, below the idle close
of the servers llmswap fronts (llama-server, uvicorn: 5 s), so it does not reuse one they are closing.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
from collections.abc import Mapping
from typing import Any

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from llmswap.config.model import Timeouts

__all__ = ["Body", "ConnectFailed", "ConnectTimeout", "Upstream", "UpstreamClosed", "UpstreamPool",
           "UpstreamProtocolError", "UpstreamResponse", "client_session", "send"]

Body = bytes | bytearray

# Seconds an idle keep-alive connection stays in the pool at most (see the module's docstring); a model's
# `timeouts.idleConn` may only shorten it.
MAX_IDLE = 4.0
# Framing the client writes from the body it sends, whatever the caller's headers say.
_FRAMING = frozenset({"content-length", "transfer-encoding"})


class UpstreamClosed(ConnectionError):
    """The upstream closed the connection before its answer was complete."""


class UpstreamProtocolError(ConnectionError):
    """The upstream's bytes are not an HTTP/1.1 answer."""


class ConnectFailed(ConnectionError):
    """No connection to the upstream (refused, unresolvable, a failed TLS handshake...)."""


class ConnectTimeout(ConnectFailed):
    """No connection to the upstream within `timeouts.connect`."""


@functools.cache
def tls_context() -> ssl.SSLContext:
    """How https upstreams are checked: the system's trust store."""
    return ssl.create_default_context()


def keepalive_seconds(timeouts: Timeouts) -> float:
    """How long an idle connection is kept: `idleConn` (0 = no limit of its own), at most `MAX_IDLE`."""
    return MAX_IDLE if timeouts.idle_conn <= 0 else min(timeouts.idle_conn, MAX_IDLE)


def _probing_socket(seconds: float) -> Any:
    """A socket factory for aiohttp's connector that turns TCP keep-alive probes on (`timeouts.keepalive`,
    as Go's dialer): a peer that vanished without closing is noticed even while nothing is sent."""

    def make(info: Any) -> socket.socket:
        family, kind, proto, _, _ = info
        sock = socket.socket(family=family, type=kind, proto=proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option in ("TCP_KEEPIDLE", "TCP_KEEPINTVL"):
            if hasattr(socket, option):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), max(1, int(seconds)))
        return sock

    return make


def client_session(timeouts: Timeouts) -> aiohttp.ClientSession:
    """A session that sends exactly what it is given, under `timeouts`."""
    connector = aiohttp.TCPConnector(
        limit=0,
        keepalive_timeout=keepalive_seconds(timeouts),
        socket_factory=_probing_socket(timeouts.keepalive) if timeouts.keepalive > 0 else None,
    )
    timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=timeouts.connect or None)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        # A shared session must not carry one client's cookies into another client's request.
        cookie_jar=aiohttp.DummyCookieJar(),
        # Send exactly the client's headers: no User-Agent, Accept or Accept-Encoding of aiohttp's own.
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        trust_env=False,
    )


def _failure(exc: BaseException, where: URL, connect_limit: float) -> BaseException:
    """aiohttp's error as one of this module's (or the exception itself when it is none of aiohttp's)."""
    at = f"{where.raw_host}:{where.port}"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return ConnectTimeout(f"could not connect to {at} within {connect_limit:g}s (timeouts.connect)")
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return ConnectFailed(f"cannot connect to {at} (TLS certificate: {exc.certificate_error})")
    if isinstance(exc, aiohttp.ClientConnectorError):
        why = exc.os_error.strerror or str(exc.os_error)
        return ConnectFailed(f"cannot connect to {at} ({why})")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return UpstreamClosed("the upstream closed the connection before its answer was complete")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return UpstreamClosed(f"the upstream broke off its answer ({exc})")
    if isinstance(exc, aiohttp.ClientResponseError):
        return UpstreamProtocolError(f"the upstream's answer is not HTTP/1.1 ({exc.message})")
    if isinstance(exc, aiohttp.ClientError):
        return UpstreamClosed(str(exc) or type(exc).__name__)
    return exc


class UpstreamResponse:
    """One answer from an upstream. Read its body with `read_chunk` (as it arrives) or `read`; then
    `release` it (its connection goes back to the pool when the answer was read whole) or `close` it
    (abandoned: the connection closes, which tells the upstream to stop)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.reason = response.reason or ""
        self.headers: CIMultiDictProxy[str] = response.headers

    async def read_chunk(self) -> bytes:
        """The body bytes that arrived since the last call, waiting for some; b"" at the end of the body.
        Raises `UpstreamClosed` / `UpstreamProtocolError` when the upstream broke off."""
        try:
            return await self._response.content.readany()
        except aiohttp.ClientError as exc:
            raise _failure(exc, self._response.url, 0) from exc

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
        self._response.release()

    def close(self) -> None:
        """Abandon the answer: its connection closes (an upstream still generating sees it go)."""
        self._response.close()

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
        self._session: aiohttp.ClientSession | None = None  # made on first use, inside the running loop
        self._closed = False

    @property
    def session(self) -> aiohttp.ClientSession:
        """The aiohttp session (websocket upgrades to this upstream go through it too)."""
        if self._closed:
            raise UpstreamClosed("the upstream pool is closed (the server is shutting down)")
        if self._session is None:
            self._session = client_session(self.timeouts)
        return self._session

    async def request(
        self,
        method: str,
        url: URL,
        headers: Mapping[str, str],
        body: Body | None = None,
    ) -> UpstreamResponse:
        """Send one request and wait for the answer's headers. `headers` are the caller's (its Host wins
        over the URL's; Content-Length is computed from `body`)."""
        for value in headers.values():
            if "\n" in value or "\r" in value:
                raise ValueError("a request header contains a line break")
        # aiohttp copies the headers it is given into a request of its own: a copy here only when some must
        # go (about 2 us a request saved, the usual case).
        sent = headers if _FRAMING.isdisjoint(map(str.lower, headers)) else CIMultiDict[str](
            (name, value) for name, value in headers.items() if name.lower() not in _FRAMING)
        session = self.session
        try:
            response = await session.request(method, url, headers=sent, data=body, allow_redirects=False,
                                             ssl=tls_context() if url.scheme == "https" else True)
        except aiohttp.ClientError as exc:
            raise _failure(exc, url, self.timeouts.connect) from exc
        except TimeoutError as exc:  # aiohttp's own connect timeout is a TimeoutError too
            raise _failure(exc, url, self.timeouts.connect) from exc
        return UpstreamResponse(response)

    async def close(self) -> None:
        """Close every connection, idle or busy; later requests fail."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()


class UpstreamPool:
    """One `Upstream` per upstream (a model id, or `peer:<id>`) and transport settings."""

    def __init__(self) -> None:
        self._upstreams: dict[tuple[str, Timeouts], Upstream] = {}
        self._closed = False

    def upstream(self, key: str, timeouts: Timeouts) -> Upstream:
        if self._closed:
            raise UpstreamClosed("the upstream pool is closed (the server is shutting down)")
        # Keyed by the timeouts too: a reload that changes them gets fresh connections while requests on
        # the old ones finish undisturbed.
        upstream = self._upstreams.get((key, timeouts))
        if upstream is None:
            upstream = self._upstreams[(key, timeouts)] = Upstream(timeouts)
        return upstream

    def websocket_session(self, key: str, timeouts: Timeouts) -> aiohttp.ClientSession:
        """The aiohttp session websocket upgrades to this upstream go through."""
        return self.upstream(key, timeouts).session

    def keys(self) -> list[str]:
        return sorted({key for key, _ in self._upstreams})

    async def close(self) -> None:
        self._closed = True
        upstreams, self._upstreams = list(self._upstreams.values()), {}
        await asyncio.gather(*(upstream.close() for upstream in upstreams), return_exceptions=True)


async def send(
    upstream: Upstream,
    method: str,
    url: URL,
    headers: Mapping[str, str],
    body: Body | None,
    header_timeout: float,
) -> UpstreamResponse:
    """Send the request and wait for the answer's headers (at most `header_timeout` s, 0 = no limit)."""
    if not header_timeout:
        return await upstream.request(method, url, headers, body)
    async with asyncio.timeout(header_timeout):
        return await upstream.request(method, url, headers, body)
