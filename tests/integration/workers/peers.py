"""The two ends of a hand-over as the tests run them, and their client.

The worker (`WorkerSide`) answers requests for `/worker...` itself and hands the connection to main at the
first request for anything else, as soon as that request's first line is in, with the bytes from that
request on. Main (`MainSide`) answers every request it gets, naming its process id and the request line, and
keeps every byte it was given, so a test sees what main read and in which order. Requests are bodiless
heads; answers are HTTP/1.1 with a Content-Length body.
"""

from __future__ import annotations

import asyncio
import os

from llmswap.workers.handover import HandOverSender


def answer(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode()


class WorkerSide(asyncio.Protocol):
    def __init__(self, sender: HandOverSender, *, big_answer: int = 0) -> None:
        self.sender = sender
        self.big_answer = big_answer  # bytes of padding in the worker's own answers
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.moving: asyncio.Task[None] | None = None
        self.moving_began = asyncio.Event()
        self.lost = False  # connection_lost reached this protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True

    def data_received(self, data: bytes) -> None:
        assert self.moving is None, "the worker read a byte after it began the hand-over"
        self.buffer += data
        while (line_end := self.buffer.find(b"\r\n")) >= 0:
            path = self.buffer[:line_end].split(b" ")[1]
            if not path.startswith(b"/worker"):
                assert self.transport is not None
                self.moving = asyncio.get_running_loop().create_task(
                    self.sender.hand_over(self.transport, bytes(self.buffer)))
                self.moving_began.set()
                return
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            line = bytes(self.buffer[:line_end])
            del self.buffer[:head_end + 4]
            assert self.transport is not None
            self.transport.write(answer(b"worker %d %s%s" % (os.getpid(), line, b"." * self.big_answer)))


class MainSide(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.received = bytearray()  # every byte given to this protocol, in order
        self._pending = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received += data
        self._pending += data
        while (end := self._pending.find(b"\r\n\r\n")) >= 0:
            line = bytes(self._pending[:self._pending.find(b"\r\n")])
            del self._pending[:end + 4]
            assert self.transport is not None
            self.transport.write(answer(b"main %d %s" % (os.getpid(), line)))


async def read_answer(reader: asyncio.StreamReader) -> str:
    """One answer's body; IncompleteReadError if the connection ends first."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
    return (await reader.readexactly(length)).decode()


async def ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> str:
    writer.write(request(path))
    return await read_answer(reader)
