"""The upstream connection pool: one keep-alive `aiohttp.ClientSession` per upstream and transport settings.

Every request to an upstream, whether it came over HTTP, from a task or from a batch, goes out on a session
of this pool, so all of them get the same transport: the model's `timeouts` and nothing else (aiohttp's
default 300 s total timeout is switched off, a long generation is the model's business).
"""

from __future__ import annotations

import asyncio

import aiohttp

from llmswap.config.model import Timeouts


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
        timeout=timeout,
        # Bytes pass through as the upstream encoded them (its Content-Encoding goes along with them).
        auto_decompress=False,
        # A shared session must not carry one client's cookies into another client's request.
        cookie_jar=aiohttp.DummyCookieJar(),
        # Send exactly the client's headers: no User-Agent, Accept or Accept-Encoding of aiohttp's own.
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        trust_env=False,
    )
