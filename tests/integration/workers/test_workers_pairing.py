"""Main pairing with a worker's connection channel, with a real AF_UNIX socket pair: a worker of the current
generation takes connections; one of a generation a reload retired (two reloads in a row: it connects
after the second began) is given none and reads its channel's end at once, so it gives back what it has
and leaves. The kernel names the peer (SO_PEERCRED); here both ends are this process, so the test says
which generation this process's pid belongs to."""

from __future__ import annotations

import asyncio
import os
import socket
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web

from llmswap.config.model import Config
from llmswap.router import build_router
from llmswap.server.state import ServerState
from llmswap.server.workers import MAIN_FIRST, Workers


def main_side(retired_pids: list[int]) -> Workers:
    config = Config()
    state = ServerState(config=config, router=build_router(config))
    # Main holds enough connections that new ones are shared in turn (`Turns`).
    held = SimpleNamespace(open_connections=MAIN_FIRST)
    front = SimpleNamespace(share=None, runner=SimpleNamespace(connection_server=lambda: held))
    workers = Workers(state, web.Application(), front, 1, [], 1.0)  # type: ignore[arg-type]
    workers._retired.append(SimpleNamespace(pids=retired_pids))  # type: ignore[arg-type]
    return workers


async def pair(workers: Workers) -> tuple[socket.socket, asyncio.Task[Any]]:
    main_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    worker_end.setblocking(False)
    pairing = asyncio.get_running_loop().create_task(workers._pair(main_end))
    for _ in range(5):
        await asyncio.sleep(0)
    return worker_end, pairing


async def test_a_worker_a_reload_retired_gets_no_connection_and_reads_the_channels_end() -> None:
    workers = main_side(retired_pids=[os.getpid()])
    worker_end, pairing = await pair(workers)

    assert await asyncio.wait_for(asyncio.get_running_loop().sock_recv(worker_end, 16), 5) == b""
    assert workers._senders == [] and workers._next_owner() is None  # new connections stay with main

    worker_end.close()
    await asyncio.wait_for(pairing, 5)


async def test_a_worker_of_the_current_generation_takes_connections() -> None:
    workers = main_side(retired_pids=[])
    worker_end, pairing = await pair(workers)

    assert len(workers._senders) == 1
    owners = {id(workers._next_owner()) for _ in range(5)}
    assert owners == {id(None), id(workers._senders[0])}  # main's share and the worker's, in turn
    with pytest.raises(TimeoutError):  # the channel stays open: connections may come
        await asyncio.wait_for(asyncio.get_running_loop().sock_recv(worker_end, 16), 0.05)

    worker_end.close()
    await asyncio.wait_for(pairing, 5)
