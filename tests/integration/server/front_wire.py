"""Talking raw HTTP/1.1 to a server for the front tests: requests written as bytes, answers parsed with
httptools, so keep-alive, pipelining and exact bytes are what the test sees."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import httptools

from tests.helpers.models import WITHIN


@dataclass
class Answer:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    raw: bytearray = field(default_factory=bytearray)  # the bytes of the whole answer as received

    def json(self) -> Any:
        return json.loads(self.body)

    def without_date(self) -> bytes:
        """The raw answer minus its Date header (the one part that changes from second to second)."""
        return b"\r\n".join(line for line in bytes(self.raw).split(b"\r\n")
                            if not line.lower().startswith(b"date:"))


def post(path: str, document: Any, *, host: str = "localhost", extra: str = "") -> bytes:
    body = json.dumps(document).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def get(path: str, *, host: str = "localhost", extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode()


class _Collector:
    def __init__(self) -> None:
        self.answers: list[Answer] = []
        self.current = Answer()
        self.parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        self.current = Answer()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.current.headers[name.decode().lower()] = value.decode()

    def on_headers_complete(self) -> None:
        self.current.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.current.body += body

    def on_message_complete(self) -> None:
        self.answers.append(self.current)


class RawClient:
    """One client connection; `send` writes bytes, `answers(n)` reads the next n answers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._collector = _Collector()
        self._taken = 0

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    @property
    def local_port(self) -> int:
        return int(self.writer.get_extra_info("sockname")[1])

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def answers(self, count: int = 1) -> list[Answer]:
        collector = self._collector
        async with asyncio.timeout(WITHIN):
            while len(collector.answers) - self._taken < count:
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionError("the server closed the connection")
                start = len(collector.answers)
                collector.parser.feed_data(data)
                # The raw bytes go to the answer being read (a read may end one and begin the next).
                reading = collector.answers[start] if len(collector.answers) > start else collector.current
                reading.raw += data
        got = collector.answers[self._taken:self._taken + count]
        self._taken += count
        return got

    async def closed_by_server(self) -> bool:
        """Whether the server closes the connection (reads until EOF, within the usual bound)."""
        async with asyncio.timeout(WITHIN):
            while await self.reader.read(65536):
                pass
        return True

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass
