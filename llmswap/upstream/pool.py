"""The upstream connection pool and sending one request over it.

Owns `UpstreamPool` (one `Upstream`, an aiohttp session of keep-alive connections, per upstream and set of
timeouts: `llmswap.upstream.client`) and `send`, the request out with the model's response-header limit.

Every request to an upstream, whether it came over HTTP, from a task, from a batch or is a websocket
upgrade, goes out through a session of this pool, so all of them get the same transport: the model's
`timeouts` and nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import aiohttp
from yarl import URL

from llmswap.config.model import Timeouts
from llmswap.upstream.client import Upstream, UpstreamClosed, UpstreamResponse

__all__ = ["Body", "Upstream", "UpstreamPool", "UpstreamResponse", "send"]

Body = bytes | bytearray


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
