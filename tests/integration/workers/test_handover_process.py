"""The hand-over across a real process boundary: a worker process accepts on a listening socket it inherited,
answers some requests itself and hands connections to this process, which serves them from then on, also
after the worker process is gone."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmswap.workers.handover import adopt_into, receive_hand_overs
from tests.integration.workers.peers import MainSide, ask, read_answer, request

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).with_name("handover_worker.py")
PID = os.getpid()


@pytest.fixture
async def worker() -> AsyncIterator[tuple[asyncio.subprocess.Process, int, list[MainSide]]]:
    """A worker process on a loopback listener, and the main protocols of the connections it handed over."""
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    main_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    mains: list[MainSide] = []
    transports: list[asyncio.Transport] = []
    adopting: set[asyncio.Task[None]] = set()

    async def adopt(sock: socket.socket, held: bytes) -> None:
        transport, protocol = await adopt_into(loop, sock, held, MainSide)
        transports.append(transport)
        mains.append(protocol)

    def on_hand_over(sock: socket.socket, held: bytes) -> None:
        task = loop.create_task(adopt(sock, held))
        adopting.add(task)
        task.add_done_callback(adopting.discard)

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(SCRIPT), str(listener.fileno()), str(worker_end.fileno()),
        pass_fds=(listener.fileno(), worker_end.fileno()), env=env, stdin=asyncio.subprocess.DEVNULL)
    worker_end.close()  # the child's copy is the only one: its exit ends the channel
    receiving = loop.create_task(receive_hand_overs(main_end, on_hand_over))
    try:
        yield process, listener.getsockname()[1], mains
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
        receiving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await receiving
        await asyncio.gather(*adopting, return_exceptions=True)
        for transport in transports:
            transport.abort()
        main_end.close()
        listener.close()


async def test_a_connection_moves_from_the_worker_process_and_outlives_it(
        worker: tuple[asyncio.subprocess.Process, int, list[MainSide]]) -> None:
    process, port, mains = worker
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    assert await ask(reader, writer, "/worker/1") == f"worker {process.pid} GET /worker/1 HTTP/1.1"
    assert await ask(reader, writer, "/main/2") == f"main {PID} GET /main/2 HTTP/1.1"
    assert await ask(reader, writer, "/worker/3") == f"main {PID} GET /worker/3 HTTP/1.1"  # main's for good

    process.send_signal(signal.SIGTERM)
    assert await process.wait() == -signal.SIGTERM
    # Every descriptor the worker had is closed now; the connection is main's alone and still open.
    assert await ask(reader, writer, "/main/4") == f"main {PID} GET /main/4 HTTP/1.1"
    assert len(mains) == 1
    assert bytes(mains[0].received) == b"".join(request(path) for path in ("/main/2", "/worker/3", "/main/4"))
    writer.close()
    await writer.wait_closed()


async def test_many_connections_cross_the_process_boundary_at_once(
        worker: tuple[asyncio.subprocess.Process, int, list[MainSide]]) -> None:
    _, port, mains = worker
    clients = [await asyncio.open_connection("127.0.0.1", port) for _ in range(16)]
    for number, (_, writer) in enumerate(clients):
        writer.write(request(f"/worker/{number}") + request(f"/main/{number}"))

    for number, (reader, _) in enumerate(clients):
        assert (await read_answer(reader)).startswith("worker ")
        assert await read_answer(reader) == f"main {PID} GET /main/{number} HTTP/1.1"
    assert len(mains) == len(clients)
    for _, writer in clients:
        writer.close()
