"""A tiny loopback HTTP upstream scripted by a test (`scripted(handler)`): each connection runs the handler,
so each connection's fate is chosen exactly; it notes the request heads it read and the connections it saw."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from yarl import URL

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Scripted"], Awaitable[None]]


@dataclass
class Scripted:
    """A loopback upstream whose every connection runs `handler`; it notes what it saw."""

    handler: Handler
    url: str = ""
    connections: int = 0
    heads: list[str] = field(default_factory=list)  # request heads, in arrival order
    client_closed: asyncio.Event = field(default_factory=asyncio.Event)  # a connection read EOF from us

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client left, or the test ended with the connection open
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> str:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        length = next((int(line.split(":", 1)[1]) for line in head.split("\r\n")[1:]
                       if line.lower().startswith("content-length:")), 0)
        await reader.readexactly(length)
        self.heads.append(head)
        return head

    async def wait_client_close(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
        self.client_closed.set()


@contextlib.asynccontextmanager
async def listening(serve: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
                    ) -> AsyncIterator[str]:
    """A loopback server running `serve` on each connection, on a free port; yields its base URL."""
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


@contextlib.asynccontextmanager
async def scripted(handler: Handler) -> AsyncIterator[Scripted]:
    upstream = Scripted(handler)
    async with listening(upstream.serve) as upstream.url:
        yield upstream


def ok(body: bytes, *extra: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), b"".join(extra), body)


async def answer_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Scripted) -> None:
    while True:
        await up.read_request(reader)
        writer.write(ok(b"hello"))


def url(up: Scripted, path: str = "/v1/x") -> URL:
    return URL(up.url + path)

