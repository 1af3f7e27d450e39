"""A worker and a main in one process, joined by a socketpair: the worker's listener on loopback, main reading
hand-overs from its end of the channel and adopting each connection into a `MainSide`."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from llmswap.workers.handover import HandOverSender, adopt_into, receive_hand_overs
from tests.integration.workers.peers import MainSide, WorkerSide


@dataclass
class Rig:
    port: int
    sender: HandOverSender
    workers: list[WorkerSide] = field(default_factory=list)  # one per accepted connection
    mains: list[MainSide] = field(default_factory=list)  # one per adopted connection
    adopted: asyncio.Event = field(default_factory=asyncio.Event)  # set at each adoption
    connected: asyncio.Event = field(default_factory=asyncio.Event)  # set at each connection accepted
    big_answer: int = 0

    async def connect(self, *, receive_buffer: int = 0) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A client connection to the worker; `receive_buffer` caps the kernel's buffer for its answers."""
        sock = socket.socket()
        if receive_buffer:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.port))
        return await asyncio.open_connection(sock=sock)

    async def wait_connected(self, count: int) -> None:
        async with asyncio.timeout(5):
            while len(self.workers) < count:
                self.connected.clear()
                await self.connected.wait()

    async def wait_adopted(self, count: int) -> None:
        async with asyncio.timeout(5):
            while len(self.mains) < count:
                self.adopted.clear()
                await self.adopted.wait()


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    loop = asyncio.get_running_loop()
    main_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    tasks: set[asyncio.Task[object]] = set()
    writers: list[asyncio.Transport] = []

    async def adopt(sock: socket.socket, held: bytes) -> None:
        transport, protocol = await adopt_into(loop, sock, held, MainSide)
        writers.append(transport)
        rig.mains.append(protocol)
        rig.adopted.set()

    def on_hand_over(sock: socket.socket, held: bytes) -> None:
        task = loop.create_task(adopt(sock, held))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def worker_protocol() -> WorkerSide:
        side = WorkerSide(rig.sender, big_answer=rig.big_answer)
        rig.workers.append(side)
        rig.connected.set()
        return side

    server = await loop.create_server(worker_protocol, "127.0.0.1", 0)
    rig = Rig(server.sockets[0].getsockname()[1], HandOverSender(worker_end))
    receiving = loop.create_task(receive_hand_overs(main_end, on_hand_over))
    try:
        yield rig
    finally:
        server.close()
        receiving.cancel()
        for task in tasks:
            task.cancel()
        for transport in writers:
            transport.abort()
        for side in rig.workers:
            if side.moving is not None:
                side.moving.cancel()
            if side.transport is not None:
                side.transport.abort()
        with contextlib.suppress(asyncio.CancelledError):
            await receiving
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()
        main_end.close()
        worker_end.close()
