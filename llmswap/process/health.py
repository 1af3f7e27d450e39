"""Deciding that a starting upstream is ready: an adaptive poll of its health endpoint.

llama-swap waits 250 ms and then probes once a second, so a cold start pays up to ~1.25 s on top of the
upstream's own load time. Here the first probe goes out at once and the gap between probes starts at 10 ms,
grows by at most x1.5 per probe, never exceeds 200 ms, and never exceeds 2.5 % of the time already spent
waiting. The detection lag is therefore a small, bounded fraction of the load itself (~12 ms for a 1 s load,
at most 200 ms for loads of 8 s and more), while a long load costs no more than five cheap loopback probes
a second.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from llmswap import calls

FIRST_POLL_DELAY = 0.010
POLL_GROWTH = 1.5
MAX_POLL_DELAY = 0.200
POLL_DELAY_FRACTION = 0.025  # of the time already spent waiting
PROBE_TIMEOUT = 1.0  # one probe; the whole start is bounded by healthCheckTimeout elsewhere
# Seconds of nothing but 404 after which the health endpoint is taken to be missing, rather than waiting out
# healthCheckTimeout: a loading server answers 503 or not at all, a server without the path answers 404.
NOT_FOUND_AFTER = 3.0

logger = logging.getLogger("llmswap.process")


def next_poll_delay(previous: float | None, elapsed: float) -> float:
    """Seconds to wait before the next probe, given the previous gap (None before the first) and the time
    spent waiting so far."""
    if previous is None:
        return FIRST_POLL_DELAY
    proportional = max(FIRST_POLL_DELAY, elapsed * POLL_DELAY_FRACTION)
    return min(MAX_POLL_DELAY, previous * POLL_GROWTH, proportional)


def health_url(proxy: str, check_endpoint: str) -> str | None:
    """The URL to probe, or None when `checkEndpoint: none` (ready as soon as spawned)."""
    endpoint = check_endpoint.strip()
    if endpoint == "none":
        return None
    if not endpoint.startswith("/"):
        endpoint = "/" + endpoint
    # Appended, not joined: a proxy with a path (`http://host:8080/base`) keeps its prefix, as in llama-swap.
    return proxy.rstrip("/") + endpoint




class HealthEndpointMissing(Exception):
    """The server answers, but only 404 at its health endpoint: it has no such path."""


def missing_endpoint_message(url: str) -> str:
    return (f"health check failed: {url} answered 404 for {NOT_FOUND_AFTER:g}s, so the server has no such "
            "endpoint (llama-cpp-python's server has no /health); set the model's checkEndpoint to a path "
            "it answers 200 on, such as /v1/models, or to none")


async def wait_until_healthy(url: str, *, clock: Callable[[], float]) -> None:
    """Return once `url` answers HTTP 200; raise `HealthEndpointMissing` once it has answered nothing but 404
    for `NOT_FOUND_AFTER` seconds. Otherwise never gives up by itself: the caller bounds and cancels it."""
    began = clock()
    delay: float | None = None
    not_found_since: float | None = None
    async with calls.session(PROBE_TIMEOUT) as session:
        while True:
            status = await calls.status_of(session, url)
            if status == 200:
                logger.debug("Health check passed on %s", url)
                return
            if status != 404:
                not_found_since = None
            elif not_found_since is None:
                not_found_since = clock()
            elif clock() - not_found_since >= NOT_FOUND_AFTER:
                raise HealthEndpointMissing(url)
            delay = next_poll_delay(delay, clock() - began)
            await asyncio.sleep(delay)
