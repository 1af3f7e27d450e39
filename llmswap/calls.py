"""The calls llmswap makes to an upstream server or a peer on its own account: a health probe, a sleep or a
wake, a KV slot's save or restore, a peer's event stream. (A client's request is relayed by
`llmswap.upstream`, over the pool's keep-alive connections and the model's timeouts.)

One way, for every module that makes such a call, to open a session, to read a status, a text or a JSON
answer (another status than 2xx raises `CallFailed`, with the server's own message), and to read
server-sent events. A session is opened per job (a start's probes, a stop's saves, a peer's stream) and
closed with it: the servers come and go with swaps and reloads, and a pool kept for them would outlive them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

MESSAGE_LIMIT = 200  # characters of an answer kept for a log line or an error


class CallFailed(Exception):
    """The server answered another status than 2xx; `message` is what it said (its error's message)."""

    def __init__(self, method: str, url: str, status: int, message: str) -> None:
        super().__init__(f"{method} {url} answered {status}" + (f": {message}" if message else ""))
        self.status = status
        self.message = message


# What a call that could not be made at all raises: refused, reset, timed out, or an answer that is not JSON.
UNREACHABLE = (aiohttp.ClientError, OSError, TimeoutError, ValueError)


def session(total: float | None = None, *, sock_connect: float | None = None,
            sock_read: float | None = None) -> aiohttp.ClientSession:
    """A session for one job: `total` bounds each call (None: no bound, for a stream), `sock_read` each
    read; no cookies are kept between calls."""
    timeout = aiohttp.ClientTimeout(total=total, sock_connect=sock_connect, sock_read=sock_read)
    return aiohttp.ClientSession(timeout=timeout, cookie_jar=aiohttp.DummyCookieJar())


async def status_of(http: aiohttp.ClientSession, url: str) -> int | None:
    """The status `url` answers a GET with, or None when it cannot be reached (not listening yet, reset,
    too slow). The body is read, so that the connection serves the next call."""
    try:
        async with http.get(url, allow_redirects=False) as response:
            await response.read()
            return response.status
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None


async def call(http: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> str:
    """The text of a 2xx answer to `method url` (with `body` as JSON, if any); `CallFailed` otherwise."""
    async with http.request(method, url, json=body) as response:
        text = await response.text()
        if not 200 <= response.status < 300:
            raise CallFailed(method, url, response.status, error_message(text) or (response.reason or ""))
        return text


async def call_json(http: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> Any:
    """A 2xx answer's JSON (`ValueError` when it is not JSON); `CallFailed` for another status."""
    return json.loads(await call(http, method, url, body))


def error_message(text: str) -> str:
    """What an error answer says: its OpenAI-style `error.message` (or `error` text), else its first
    characters."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:MESSAGE_LIMIT]
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message", ""))[:MESSAGE_LIMIT]
    if isinstance(error, str):
        return error[:MESSAGE_LIMIT]
    return text.strip()[:MESSAGE_LIMIT]


async def events(response: aiohttp.ClientResponse, heard: Callable[[], None]) -> AsyncIterator[str]:
    """The data of each server-sent event of `response` (its `data:` lines joined), as they come; `heard` is
    called on every line, comments and keep-alives included (the stream is alive)."""
    data: list[str] = []
    async for raw in response.content:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        heard()
        if line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
        elif not line and data:
            yield "\n".join(data)
            data = []
