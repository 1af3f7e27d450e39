"""The calls that put a server to sleep and wake it (`sleep:` and `wake:`, e.g. vLLM's sleep mode), run by a
`Process`'s supervisor while the child stays alive.

A wake is complete when the wake call answered 2xx and, where the server answers `GET /is_sleeping`, that
says `{"is_sleeping": false}` (vLLM's `/health` stays 200 while asleep, so it proves nothing). A call that
fails, answers another status or takes longer than its bound returns the reason, which the supervisor logs
before it stops the server instead (a failed sleep) or restarts it cold (a failed wake).
"""

from __future__ import annotations

import asyncio
import time

from llmswap import calls
from llmswap.config.model import ModelConfig

POLL = 0.1  # seconds between two GET /is_sleeping while a wake completes


async def perform(config: ModelConfig, what: str) -> str | None:
    """Put the server to sleep (bounded by its unloadTimeout) or wake it (bounded by its healthCheckTimeout,
    as a start is); None when done, else why not."""
    if what == "sleep":
        assert config.sleep_call is not None
        return await call(config, config.sleep_call, config.unload_timeout)
    assert config.wake_call is not None
    failed = await call(config, config.wake_call, config.health_check_timeout)
    return failed or await wait_awake(config, config.health_check_timeout)


async def call(config: ModelConfig, which: tuple[str, str], timeout: float) -> str | None:
    """Send `which` (method, path) to the model's server; None when it answered 2xx, else why not."""
    method, path = which
    url = config.proxy.rstrip("/") + path
    try:
        async with calls.session(timeout) as session:
            await calls.call(session, method, url)
            return None
    except calls.CallFailed as failed:
        return f"{method} {path} answered {failed.status} {failed.message}".rstrip()
    except calls.UNREACHABLE as exc:
        return f"{method} {path} failed: {type(exc).__name__} {exc}".rstrip()


async def wait_awake(config: ModelConfig, timeout: float) -> str | None:
    """After a wake call: poll `GET /is_sleeping` until it says false (None), or say why not. A server
    without that endpoint (404) is taken at its word."""
    url = config.proxy.rstrip("/") + "/is_sleeping"
    deadline = time.monotonic() + timeout
    async with calls.session(timeout) as session:
        while True:
            try:
                body = await calls.call_json(session, "GET", url)
                if isinstance(body, dict) and body.get("is_sleeping") is False:
                    return None
            except calls.CallFailed as failed:
                if failed.status == 404:
                    return None
            except calls.UNREACHABLE as exc:
                return f"GET /is_sleeping failed: {type(exc).__name__} {exc}".rstrip()
            if time.monotonic() >= deadline:
                return f"GET /is_sleeping still said asleep after {timeout:g}s"
            await asyncio.sleep(POLL)
