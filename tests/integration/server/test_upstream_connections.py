"""Through the whole server: a client that leaves mid-answer closes the upstream's connection (so the
upstream stops generating), and an answer relayed whole leaves its connection in the pool for the next one.

The upstream is a tiny asyncio server scripted by the test, reached as a peer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp

from llmswap.config.model import Config, PeerConfig
from tests.helpers.scripted_upstream import listening
from tests.integration.server.conftest import ServeConfig

CHAT = {"model": "pm", "messages": [{"role": "user", "content": "hi"}], "stream": True}


class Streaming:
    """Streams one SSE event per request, then finishes the answer (`finish`) or waits for the proxy to
    close the connection."""

    def __init__(self) -> None:
        self.url = ""
        self.connections = 0
        self.closed_by_proxy = asyncio.Event()
        self.finish = False

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n10\r\ndata: {\"n\": 1}\n\n\r\n")
                if not self.finish:
                    while await reader.read(65536):
                        pass
                    self.closed_by_proxy.set()  # end of file: the proxy closed the connection
                    return
                writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            self.closed_by_proxy.set()
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def streaming_upstream() -> AsyncIterator[Streaming]:
    upstream = Streaming()
    async with listening(upstream.serve) as upstream.url:
        yield upstream


def peer_config(url: str) -> Config:
    return Config(peers={"p": PeerConfig(id="p", proxy=url, models=("pm",))})


async def test_a_client_gone_mid_answer_closes_the_upstream_connection(serve_config: ServeConfig) -> None:
    async with streaming_upstream() as upstream:
        served = await serve_config(peer_config(upstream.url))
        async with aiohttp.ClientSession() as http:
            response = await http.post(served.at("/v1/chat/completions"), json=CHAT)
            assert response.status == 200
            assert (await response.content.readuntil(b"\n\n")).startswith(b"data: ")
            response.close()  # the client hangs up mid-stream
        await asyncio.wait_for(upstream.closed_by_proxy.wait(), 10)


async def test_an_answer_relayed_whole_leaves_its_connection_for_the_next_request(
    serve_config: ServeConfig,
) -> None:
    async with streaming_upstream() as upstream:
        upstream.finish = True
        served = await serve_config(peer_config(upstream.url))
        async with aiohttp.ClientSession() as http:
            for _ in range(3):
                async with http.post(served.at("/v1/chat/completions"), json=CHAT) as response:
                    assert response.status == 200
                    assert (await response.read()).endswith(b"data: [DONE]\n\n")
        assert upstream.connections == 1
