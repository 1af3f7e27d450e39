"""A request goes to an upstream a second time only when that cannot deliver it twice: an upstream that
reads a POST and hangs up gets it once (the client a 502), an idempotent GET on a pooled connection the
upstream dropped is resent on a fresh one, and a pooled connection the upstream closed while idle is
simply replaced.

The upstream here is a tiny asyncio HTTP server in the test, so each connection's fate is chosen exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import aiohttp

from llmswap.config.model import Config, PeerConfig
from tests.helpers.scripted_upstream import listening
from tests.helpers.wait import until
from tests.integration.server.conftest import ServeConfig, Served

CHAT = {"model": "pm", "messages": [{"role": "user", "content": "hi"}]}
ANSWER = b'{"object": "chat.completion", "choices": []}'

# (connection number, request number on it), both from 1 → "answer", "drop" (read it, close, say nothing)
# or "answer-close" (answer with keep-alive, then close the connection while idle).
Policy = Callable[[int, int], str]


@dataclass
class TinyUpstream:
    policy: Policy
    received: list[tuple[int, str, str]] = field(default_factory=list)  # (connection, method, path)
    idle_closes: int = 0
    connections: int = 0
    url: str = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        try:
            for count in range(1, 1000):
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = next((int(line.split(":", 1)[1]) for line in lines[1:]
                               if line.lower().startswith("content-length:")), 0)
                await reader.readexactly(length)
                self.received.append((number, method, path))
                fate = self.policy(number, count)
                if fate == "drop":
                    return
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))
                await writer.drain()
                if fate == "answer-close":
                    self.idle_closes += 1
                    return
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


@contextlib.asynccontextmanager
async def tiny_upstream(policy: Policy) -> AsyncIterator[TinyUpstream]:
    upstream = TinyUpstream(policy)
    async with listening(upstream.handle) as upstream.url:
        yield upstream


def peer_config(url: str) -> Config:
    return Config(peers={"p": PeerConfig(id="p", proxy=url, models=("pm",))})


async def post_chat(http: aiohttp.ClientSession, served: Served) -> tuple[int, dict[str, object]]:
    async with http.post(served.at("/v1/chat/completions"), json=CHAT) as response:
        return response.status, await response.json(content_type=None)


async def test_a_post_the_upstream_read_and_dropped_is_delivered_once_and_answered_502(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    async with tiny_upstream(lambda connection, count: "drop") as upstream:
        served = await serve_config(peer_config(upstream.url))
        status, body = await post_chat(http, served)
        assert status == 502, body
        assert set(body) == {"error"} and "peer proxy error" in str(body["error"])
        assert upstream.received == [(1, "POST", "/v1/chat/completions")]


async def test_a_post_on_a_pooled_connection_dropped_after_sending_is_not_resent(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    async with tiny_upstream(lambda connection, count: "drop" if count == 2 else "answer") as upstream:
        served = await serve_config(peer_config(upstream.url))
        assert (await post_chat(http, served))[0] == 200
        status, body = await post_chat(http, served)  # goes out on the pooled connection, which is dropped
        assert status == 502, body
        assert [c for c, _, _ in upstream.received] == [1, 1], "the second POST was delivered twice"


async def test_an_idempotent_get_on_a_dropped_pooled_connection_is_resent_once(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    async with tiny_upstream(lambda connection, count: "drop" if count == 2 else "answer") as upstream:
        served = await serve_config(peer_config(upstream.url))
        for _ in range(2):
            async with http.get(served.at("/props?model=pm")) as response:
                assert response.status == 200, await response.text()
        assert [(c, m) for c, m, _ in upstream.received] == [(1, "GET"), (1, "GET"), (2, "GET")]


async def test_a_pooled_connection_the_upstream_closed_while_idle_is_replaced(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    async with tiny_upstream(lambda connection, count: "answer-close") as upstream:
        served = await serve_config(peer_config(upstream.url))
        assert (await post_chat(http, served))[0] == 200
        await until(lambda: upstream.idle_closes == 1, what="the upstream closing its idle connection")
        await asyncio.sleep(0.05)  # the close reaches llmswap's side of the connection
        assert (await post_chat(http, served))[0] == 200
        assert [c for c, _, _ in upstream.received] == [1, 2]
