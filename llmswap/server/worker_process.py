"""A worker process: serves the front's fast requests on the connections main gives it, on a core of its
own, while the main process keeps the only scheduler and every other behaviour (`llmswap.server.workers`).

It reads the same config sources as main, and serves with the same code: `FrontConnection` and
`serve_fast`, `fast_plan` with this process's config, relay and recording. What belongs to main goes there
over the control channel (`llmswap.workers.channel`):

- each lease: `RemoteLeases` asks main's scheduler (`front.serve` takes that path when `REMOTE_LEASES` is
  set), which counts it in flight, queues, limits, preempts, and lists it with a cancel;
- each request's `Answered`: main writes its access line and tells its observers (`/metrics`);
- the activity rows and captures, in the batches the recorder settles (`ShippingRecorder`): main numbers
  and keeps them, so `/api/metrics/activity`, captures, stats and token counters cover every request;
- log records at the config's level, logged again by main as this worker's.

Connections arrive from main over the hand-over socket (`llmswap.workers.handover`), and any request that
is not fast goes back there with its connection. When main sends no more (the end of that channel: a
reload started new workers), every connection goes back to main at its next request boundary, and the
worker exits once it holds none. On SIGTERM (main stops) it closes its idle connections, lets answers in
flight finish within the grace main gives, with `Connection: close`, and exits; it exits as well when
main's control channel closes.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
from pathlib import Path
from typing import Any

from aiohttp import web

from llmswap.activity.captures import Capture
from llmswap.activity.record import ActivityRecord
from llmswap.activity.recorder import ActivityRecorder
from llmswap.activity.wire import capture_fields, record_fields
from llmswap.config import ConfigSources
from llmswap.dispatch.pool import UpstreamPool
from llmswap.process.logring import LogRing
from llmswap.router import build_router
from llmswap.server import guard, inflight, middleware
from llmswap.server.activity_api import ACTIVITY_KEY, settings_of
from llmswap.server.front.protocol import FrontConnection
from llmswap.server.front.request import FastPlan, FrontRequest, route_table
from llmswap.server.front.serve import serve_fast
from llmswap.server.guardrails import REPORTED
from llmswap.server.inference import ROUTES
from llmswap.server.logsetup import PROXY_LOGGER, level_number
from llmswap.server.middleware import REQUEST_OBSERVERS, Answered
from llmswap.server.profiles import active_profile
from llmswap.server.state import STATE, ServerState
from llmswap.workers.channel import Channel, Message
from llmswap.workers.handover import HandOverSender, adopt_into, receive_hand_overs
from llmswap.workers.leases import REMOTE_LEASES, RemoteLeases
from llmswap.workers.supervisor import WORKER_INDEX_ENV

log = logging.getLogger("llmswap.server")

CONTROL_ENV = "LLMSWAP_WORKERS_DIR"  # the private folder of main's two Unix sockets
GRACE_ENV = "LLMSWAP_WORKER_GRACE"  # seconds answers in flight get to finish at a SIGTERM
CONTROL_SOCKET = "control.sock"
HANDOVER_SOCKET = "handover.sock"
LEAVE_WAIT = 2.0  # seconds a worker that is done waits for main to close the control channel after it


class ShippingRecorder(ActivityRecorder):
    """The recorder of a worker: rows and captures settle as in main, then go to main in one message per
    batch instead of into a log and a ring here."""

    def __init__(self, channel: Channel, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.channel = channel
        self._batch: list[tuple[Any, Any]] = []

    def keep(self, record: ActivityRecord, capture: Capture | None) -> None:
        self._batch.append((record_fields(record), None if capture is None else capture_fields(capture)))

    def settle(self) -> None:
        super().settle()
        if self._batch:
            batch, self._batch = self._batch, []
            self.channel.send(("rows", tuple(batch)))


class _Shipping(logging.Handler):
    """Log records to main, which logs them again as this worker's."""

    def __init__(self, channel: Channel) -> None:
        super().__init__()
        self.channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
            self.channel.send(("log", record.levelno, record.name, text))
        except Exception:
            self.handleError(record)


class WorkerFront:
    """What this worker's front connections share (`llmswap.server.front.protocol.Front`): the fast path,
    and main for everything else."""

    def __init__(self, app: web.Application, sender: HandOverSender) -> None:
        self.app = app
        self.routes = route_table(ROUTES)
        self.sender = sender
        self.connections: set[FrontConnection] = set()
        self._moving: set[asyncio.Task[None]] = set()
        self._emptied: asyncio.Future[None] | None = None  # while retiring: set when nothing is left here

    def header_timeout(self) -> float:
        return self.app[STATE].config.client_header_timeout

    def held(self, connection: FrontConnection) -> None:
        self.connections.add(connection)
        if self._emptied is not None:
            connection.loop.call_soon(connection.move_on)  # once it has what it was handed over with

    def released(self, connection: FrontConnection) -> None:
        self.connections.discard(connection)
        self._check_emptied()

    async def serve(self, connection: FrontConnection, request: FrontRequest, plan: FastPlan) -> None:
        await serve_fast(connection, request, plan)

    def hand_over(self, transport: asyncio.Transport, rest: bytes, *, write_paused: bool) -> None:
        task = asyncio.get_running_loop().create_task(self.sender.move(transport, rest, "the main process"))
        self._moving.add(task)
        task.add_done_callback(self._moved)

    def _moved(self, task: asyncio.Task[None]) -> None:
        self._moving.discard(task)
        self._check_emptied()

    def _check_emptied(self) -> None:
        emptied = self._emptied
        if emptied is not None and not self.connections and not self._moving and not emptied.done():
            emptied.set_result(None)

    async def retire(self) -> None:
        """Main sends no more connections (a reload started new workers): give each one back at its next
        request boundary, idle ones now, and return once none is left here."""
        self._emptied = asyncio.get_running_loop().create_future()
        for connection in list(self.connections):
            connection.move_on()
        self._check_emptied()
        await self._emptied

    async def stop(self, grace: float) -> None:
        for connection in list(self.connections):
            connection.close_if_idle()
        await asyncio.gather(*(c.shutdown(grace) for c in list(self.connections)), *self._moving,
                             return_exceptions=True)


def worker_app(state: ServerState, channel: Channel) -> web.Application:
    """The app the front's helpers read (`request.app`): the state, the response hooks (CORS, in-flight),
    the observers (main's, over the channel), the contexts upstreams report."""
    app = web.Application()
    app[STATE] = state
    middleware.setup(app)
    guard.setup(app)
    inflight.setup(app)
    app[REPORTED] = {}

    def answered(facts: Answered) -> None:
        channel.send(("answered", tuple(facts)))

    app[REQUEST_OBSERVERS].append(answered)
    app.freeze()
    return app


async def serve_worker(sources: ConfigSources, host: str, folder: Path, index: int,
                       log_level: str | None = None) -> int:
    config = sources.load()
    loop = asyncio.get_running_loop()
    state = ServerState(config=config, router=build_router(config), proxy_log=LogRing("proxy"),
                        loopback_listener=guard.is_loopback_listener(host))
    leases = state.extras[REMOTE_LEASES] = RemoteLeases(UpstreamPool())
    ended = asyncio.Event()
    grace = [0.0]

    def heard(channel: Channel, message: Message) -> None:
        if message[0] == "profile":  # main's active profile, at the start and at each change
            active_profile(state).name = message[1]
        elif message[0] == "settle":  # a reader in main: the rows so far, then say so (in that order)
            state.extras[ACTIVITY_KEY].settle()
            channel.send(("settled", message[1]))
        else:
            leases.on_message(channel, message)

    def lost(channel: Channel, error: BaseException | None) -> None:
        leases.on_lost(channel, error)
        ended.set()  # main is gone: nothing can be granted, nobody keeps what this one records

    def stop() -> None:
        grace[0] = float(os.environ.get(GRACE_ENV, "10"))
        ended.set()

    _, channel = await loop.create_unix_connection(lambda: Channel(heard, lost), str(folder / CONTROL_SOCKET))
    leases.channel = channel
    channel.send(("hello", index, os.getpid()))
    _log_to_main(channel, log_level or config.log_level)
    recorder = state.extras[ACTIVITY_KEY] = ShippingRecorder(channel, settings_of(config))
    handover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    handover.setblocking(False)  # the loop's socket calls require it (asyncio's debug mode checks)
    await loop.sock_connect(handover, str(folder / HANDOVER_SOCKET))
    front = WorkerFront(worker_app(state, channel), HandOverSender(handover))
    receiving = loop.create_task(_receive(handover, front, ended))
    loop.add_signal_handler(signal.SIGTERM, stop)
    loop.add_signal_handler(signal.SIGINT, lambda: None)  # main decides when its workers stop
    await ended.wait()
    receiving.cancel()
    await front.stop(grace[0])
    recorder.settle()
    await channel.leave(LEAVE_WAIT)
    handover.close()
    await leases.pool.close()
    return 0


async def _receive(channel: socket.socket, front: WorkerFront, ended: asyncio.Event) -> None:
    """Serve the connections main sends, until it closes the channel."""
    loop = asyncio.get_running_loop()
    adopting: set[asyncio.Task[Any]] = set()

    def adopt(sock: socket.socket, held: bytes) -> None:
        task = loop.create_task(adopt_into(loop, sock, held, lambda: FrontConnection(front)))
        adopting.add(task)
        task.add_done_callback(adopting.discard)

    try:
        await receive_hand_overs(channel, adopt)
        # The channel's end: main sends no more connections (a reload; were main gone, the control
        # channel says so and this is cancelled). The ones it did send are adopted, then all go back.
        await asyncio.gather(*adopting, return_exceptions=True)
        await front.retire()
    except ConnectionError as exc:
        log.warning("the connection channel from main broke: %s", exc)
    finally:
        ended.set()


def _log_to_main(channel: Channel, level: str) -> None:
    proxy = logging.getLogger(PROXY_LOGGER)
    for handler in list(proxy.handlers):
        proxy.removeHandler(handler)
    proxy.setLevel(level_number(level))
    proxy.propagate = False
    proxy.addHandler(_Shipping(channel))
    logging.getLogger("llmswap.access").setLevel(logging.WARNING)  # main writes worker requests' lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmswap-worker", description="(started by llmswap --workers N)")
    parser.add_argument("--config", type=Path)
    parser.add_argument("--config-dir", type=Path)
    parser.add_argument("--host", default="")
    parser.add_argument("--log-level")
    args = parser.parse_args(argv)
    folder = Path(os.environ[CONTROL_ENV])
    index = int(os.environ.get(WORKER_INDEX_ENV, "0"))
    return asyncio.run(serve_worker(ConfigSources(args.config, args.config_dir), args.host, folder, index,
                                    args.log_level))


if __name__ == "__main__":
    raise SystemExit(main())
