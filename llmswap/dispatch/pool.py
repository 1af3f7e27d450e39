"""The upstream connection pool and sending one request over it.

Owns `UpstreamPool` (one keep-alive `aiohttp.ClientSession` per upstream), the request bodies `forward`
sends (`SplicedBody`), and `send`: the request out, once more on a fresh connection only when doing so
cannot deliver it twice (see `may_resend`).

Every request to an upstream, whether it came over HTTP, from a task or from a batch, goes out on a session
of this pool, so all of them get the same transport: the model's `timeouts` and nothing else (aiohttp's
default 300 s total timeout is switched off, a long generation is the model's business).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from llmswap.config.model import Timeouts

log = logging.getLogger("llmswap.proxy")

# -------------------------------------------------------------------------------- connection pool


class UpstreamPool:
    """One keep-alive `ClientSession` per upstream (a model id, or `peer:<id>`) and transport settings."""

    def __init__(self) -> None:
        self._sessions: dict[tuple[str, Timeouts], aiohttp.ClientSession] = {}
        self._closed = False

    def session(self, key: str, timeouts: Timeouts) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("the upstream pool is closed (the server is shutting down)")
        # Keyed by the timeouts too: a reload that changes them gets a fresh session while requests on the
        # old one finish undisturbed.
        session = self._sessions.get((key, timeouts))
        if session is None or session.closed:
            session = new_session(timeouts)
            self._sessions[(key, timeouts)] = session
        return session

    def keys(self) -> list[str]:
        return sorted({key for key, _ in self._sessions})

    async def close(self) -> None:
        self._closed = True
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)


def new_session(timeouts: Timeouts) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(
        limit=0,  # the scheduler's concurrencyLimit bounds requests per model, not the pool
        keepalive_timeout=timeouts.idle_conn or None,
        enable_cleanup_closed=False,
    )
    timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=timeouts.connect or None)
    return aiohttp.ClientSession(
        connector=connector,
        trace_configs=[_trace_config()],  # tells `send` whether a failed try may be resent
        timeout=timeout,
        # Bytes pass through as the upstream encoded them (its Content-Encoding goes along with them).
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

    async def chunks(self) -> AsyncIterator[bytes | memoryview]:
        for part in self.parts:
            yield part


Body = bytes | bytearray | SplicedBody


# -------------------------------------------------------------------------------- sending


# Methods whose repetition has no further effect (RFC 9110 9.2.2); POST, PATCH... may not be sent twice.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


@dataclass
class Attempt:
    """What one try at sending learned about its connection (filled in by the session's trace hooks)."""

    reused: bool = False  # the connection came from the pool (it served a request before)
    handed_over: bool = False  # the request's headers were given to the connection to write


def may_resend(method: str, headers: Mapping[str, str], attempt: Attempt) -> bool:
    """Whether a try that failed before any answer may go out again on a fresh connection — as Go's
    transport decides: only on a reused connection (a fresh one that fails is the upstream's answer), and
    then when the request provably never left, or when sending it twice is harmless."""
    if not attempt.reused:
        return False
    if not attempt.handed_over:
        return True
    return method.upper() in IDEMPOTENT_METHODS or "Idempotency-Key" in headers


async def _on_reuse(_: aiohttp.ClientSession, context: SimpleNamespace, __: object) -> None:
    attempt = (context.trace_request_ctx or {}).get("attempt")
    if isinstance(attempt, Attempt):
        attempt.reused = True


async def _on_headers(_: aiohttp.ClientSession, context: SimpleNamespace, __: object) -> None:
    attempt = (context.trace_request_ctx or {}).get("attempt")
    if isinstance(attempt, Attempt):
        attempt.handed_over = True


def _trace_config() -> aiohttp.TraceConfig:
    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(_on_reuse)
    trace.on_request_headers_sent.append(_on_headers)
    return trace


async def send(
    session: aiohttp.ClientSession,
    method: str,
    url: URL,
    headers: CIMultiDict[str],
    body: Body | None,
    header_timeout: float,
) -> aiohttp.ClientResponse:
    """Send the request; once more on a fresh connection when a pooled one broke and `may_resend` says a
    second copy cannot reach the upstream (an upstream may close an idle keep-alive connection — llama-server
    after 5 s — just as llmswap reuses it)."""
    for try_number in (1, 2):
        data = body.chunks() if isinstance(body, SplicedBody) else body
        attempt = Attempt()
        try:
            async with asyncio.timeout(header_timeout or None):
                return await session.request(method, url, headers=headers, data=data, allow_redirects=False,
                                             trace_request_ctx={"attempt": attempt})
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            if try_number == 2 or not may_resend(method, headers, attempt):
                raise
            log.debug("%s %s: the pooled connection was closed by the upstream; sending again on a fresh one",
                      method, url)
    raise AssertionError("unreachable")
