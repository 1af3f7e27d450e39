"""The upstream connection pool and sending one request over it.

Owns `UpstreamPool` (one `Upstream` of keep-alive connections per upstream, `llmswap.dispatch.http1`), the
request bodies `forward` sends (`SplicedBody`), and `send`: the request out, once more on a fresh connection
only when doing so cannot deliver it twice (see `may_resend`).

Every request to an upstream, whether it came over HTTP, from a task or from a batch, goes out on a
connection of this pool, so all of them get the same transport: the model's `timeouts` and nothing else.
Websocket upgrades are the one exception: they go through an aiohttp session each `Upstream` opens for them
on first use (`websocket_session`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
from yarl import URL

from llmswap.config.model import Timeouts
from llmswap.dispatch.http1 import Attempt, Upstream, UpstreamResponse

log = logging.getLogger("llmswap.proxy")

__all__ = ["Attempt", "Body", "SplicedBody", "Upstream", "UpstreamPool", "UpstreamResponse", "may_resend",
           "send", "websocket_session"]

# -------------------------------------------------------------------------------- connection pool


class UpstreamPool:
    """One `Upstream` per upstream (a model id, or `peer:<id>`) and transport settings."""

    def __init__(self) -> None:
        self._upstreams: dict[tuple[str, Timeouts], Upstream] = {}
        self._sockets: dict[tuple[str, Timeouts], aiohttp.ClientSession] = {}
        self._closed = False

    def upstream(self, key: str, timeouts: Timeouts) -> Upstream:
        if self._closed:
            raise RuntimeError("the upstream pool is closed (the server is shutting down)")
        # Keyed by the timeouts too: a reload that changes them gets fresh connections while requests on
        # the old ones finish undisturbed.
        upstream = self._upstreams.get((key, timeouts))
        if upstream is None:
            upstream = self._upstreams[(key, timeouts)] = Upstream(timeouts)
        return upstream

    def websocket_session(self, key: str, timeouts: Timeouts) -> aiohttp.ClientSession:
        """The aiohttp session websocket upgrades to this upstream go through."""
        if self._closed:
            raise RuntimeError("the upstream pool is closed (the server is shutting down)")
        session = self._sockets.get((key, timeouts))
        if session is None or session.closed:
            session = self._sockets[(key, timeouts)] = websocket_session(timeouts)
        return session

    def keys(self) -> list[str]:
        return sorted({key for key, _ in self._upstreams} | {key for key, _ in self._sockets})

    async def close(self) -> None:
        self._closed = True
        upstreams, self._upstreams = list(self._upstreams.values()), {}
        for upstream in upstreams:
            upstream.close()
        sessions, self._sockets = list(self._sockets.values()), {}
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)


def websocket_session(timeouts: Timeouts) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=0, enable_cleanup_closed=False)
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


# -------------------------------------------------------------------------------- request bodies


@dataclass(frozen=True)
class SplicedBody:
    """A body made of slices of the client's body and small replacements, sent without joining them into
    one more copy of a possibly large upload."""

    parts: Sequence[bytes | memoryview] = field(default_factory=tuple)

    @property
    def size(self) -> int:
        return sum(len(part) for part in self.parts)


Body = bytes | bytearray | SplicedBody


# -------------------------------------------------------------------------------- sending


# Methods whose repetition has no further effect (RFC 9110 9.2.2); POST, PATCH... may not be sent twice.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


def may_resend(method: str, headers: Mapping[str, str], attempt: Attempt) -> bool:
    """Whether a try that failed before any answer may go out again on a fresh connection — as Go's
    transport decides: only on a reused connection (a fresh one that fails is the upstream's answer), and
    then when the request provably never left, or when sending it twice is harmless."""
    if not attempt.reused:
        return False
    if not attempt.handed_over:
        return True
    return method.upper() in IDEMPOTENT_METHODS or "Idempotency-Key" in headers


async def send(
    upstream: Upstream,
    method: str,
    url: URL,
    headers: Mapping[str, str],
    body: Body | None,
    header_timeout: float,
) -> UpstreamResponse:
    """Send the request and wait for the answer's headers (at most `header_timeout` s, 0 = no limit);
    once more on a fresh connection when a pooled one broke and `may_resend` says a second copy cannot
    reach the upstream twice (an upstream may close an idle keep-alive connection — llama-server after
    5 s — just as llmswap reuses it)."""
    data = list(body.parts) if isinstance(body, SplicedBody) else body
    for try_number in (1, 2):
        attempt = Attempt()
        try:
            if not header_timeout:
                return await upstream.request(method, url, headers, data, attempt)
            async with asyncio.timeout(header_timeout):
                return await upstream.request(method, url, headers, data, attempt)
        except OSError:
            if try_number == 2 or not may_resend(method, headers, attempt):
                raise
            log.debug("%s %s: the pooled connection was closed by the upstream; sending again on a fresh one",
                      method, url)
    raise AssertionError("unreachable")
