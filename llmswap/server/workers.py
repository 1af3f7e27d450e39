"""Worker processes beside the main one (`llmswap --workers N`): more cores for the front's fast requests,
one scheduler for all of them.

Python runs one request at a time per process, and a proxy that only relays small answers spends a core
on it long before the models behind it are busy. Main accepts every connection and passes new ones in turn
to the workers (`_share`), which serve the front's fast requests — non-streaming JSON to a local model —
with the same code as main (`llmswap.server.worker_process`). Everything else stays main's, one owner per
behaviour:

- the scheduler: every lease a worker serves is granted here (`GrantService`), so `concurrencyLimit`,
  queueing, swaps, preemption and the in-flight count see every request; the in-flight list shows a
  worker's requests (`TrackedEntries`) and its cancel reaches the worker;
- records: a worker sends each request's `Answered` (the access line and `/metrics` are written here)
  and its activity rows and captures, which are numbered and kept here, and its log records;
- connections: a request a worker does not serve (any route but the fast ones, a stream, a refusal...)
  moves to main with its connection (`llmswap.workers.handover`) and is served by main's front;
- state: a worker reads the config sources itself at start; a reload restarts the workers (answers in
  flight finish on the old ones, as in main, and their connections come back to be shared anew: a reload
  closes none), and the active profile is sent to each as it changes.

Main's two Unix sockets (control messages, hand-overs) are in a private folder (mode 0700) removed at the
stop. TLS turns workers off (a TLS session cannot move between processes), as does `--workers 0`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import struct
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from llmswap.activity.wire import capture_from, record_from
from llmswap.server.activity_api import recorder_of
from llmswap.server.front.protocol import FrontConnection
from llmswap.server.front.site import Front as SharedFront
from llmswap.server.inflight import tracker_of
from llmswap.server.middleware import REQUEST_OBSERVERS, Answered, report
from llmswap.server.profiles import active_profile, watch_profile
from llmswap.server.proxy import dispatcher
from llmswap.server.state import ServerState, state
from llmswap.server.worker_entries import TrackedEntries
from llmswap.server.worker_process import CONTROL_ENV, CONTROL_SOCKET, GRACE_ENV, HANDOVER_SOCKET
from llmswap.workers.channel import Channel, Message
from llmswap.workers.grants import GrantService
from llmswap.workers.handover import Adopt, HandOverSender, adopt_into, receive_hand_overs
from llmswap.workers.supervisor import Supervisor, WorkerSpec
from llmswap.workers.turns import Turns

log = logging.getLogger("llmswap.workers")

WORKERS_KEY = "workers"  # ServerState.extras key of the running `Workers`
# Of every 5 new connections, main keeps 2 and a worker takes 3: a worker's request costs main about a
# quarter of what one of its own does (its grant, record and access line), which this evens out
# (`bench.wrk_nginx --workers 1`: main and the worker both near a full core, where 1:1 left main the
# bottleneck and the worker at 0.6 of a core). Main keeps every new connection while it holds fewer than
# MAIN_FIRST: a lone client is served without the messages between processes (see `Turns`).
MAIN_SHARE, WORKER_SHARE, MAIN_FIRST = 2, 3, 4
SETTLE_WAIT = 2.0  # seconds a reader of activity waits for the workers' rows at most
PEER_CREDENTIALS = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid of a Unix socket's other end
PAIR_WAIT = 30.0  # seconds a reload waits for its new workers before the old ones give their connections back


def workers_unavailable(tls: bool, platform: str | None = None) -> str | None:
    """Why worker processes cannot serve here (on `platform`, default this one), or None when they can."""
    platform = sys.platform if platform is None else platform
    if tls:
        return "a TLS connection cannot move between processes (--tls-cert-file is given)"
    if not platform.startswith("linux"):
        # Connections move as Linux delivers SCM_RIGHTS (`llmswap.workers.handover`), and main tells a
        # reload's retired workers apart by SO_PEERCRED.
        return f"worker processes need Linux (this is {platform})"
    return None


class Workers:
    """Main's side of its workers: start, serve their messages and hand-overs, restart, stop."""

    def __init__(self, state: ServerState, app: web.Application, front: SharedFront, count: int,
                 argv: list[str], grace: float) -> None:
        self.state = state
        self.app = app
        self.front = front
        self.count = count
        self.grants = GrantService(lambda: dispatcher(state), TrackedEntries(tracker_of(state)))
        self.channels: dict[Channel, WorkerSeen] = {}  # the workers connected now
        self._senders: list[HandOverSender] = []  # the workers that take new connections, in turn
        self._turns = Turns(MAIN_SHARE, WORKER_SHARE, MAIN_FIRST)
        self._keeping = 0  # new connections main kept in this turn of the loop (`_share`)
        self._argv = argv
        self._grace = grace
        self._folder: Path | None = None
        self._control: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.supervisor: Supervisor | None = None
        self._pairing = asyncio.Condition()  # notified when a worker's channel pairs
        self._retired: list[Supervisor] = []  # the old workers of reloads, until they are gone
        self._settles: dict[int, tuple[asyncio.Future[None], set[Channel]]] = {}
        self._settle_ids = 0

    async def start(self) -> None:
        self.state.extras[WORKERS_KEY] = self
        loop = asyncio.get_running_loop()
        folder = self._folder = Path(tempfile.mkdtemp(prefix="llmswap-workers-"))  # mode 0700
        self._control = await loop.create_unix_server(
            lambda: Channel(self._on_message, self._on_lost), str(folder / CONTROL_SOCKET))
        handover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        handover.bind(str(folder / HANDOVER_SOCKET))
        handover.listen()
        handover.setblocking(False)
        self._spawn(self._accept_hand_overs(handover))
        watch_profile(self.state, self._profile_changed)
        self.front.share = self._share
        recorder_of(self.state).remote.append(self.settled)
        env = {CONTROL_ENV: str(folder), GRACE_ENV: str(self._grace)}
        self._spec = WorkerSpec(argv=self._argv, env=env)
        self.supervisor = Supervisor(self._spec)
        await self.supervisor.start(self.count)

    async def restart(self) -> None:
        """New workers on the current config (after a reload). The old ones get no new connection, finish
        their answers and give every connection back at its next request boundary (shared anew, see
        `_adopt`: no client loses its keep-alive connection to a reload), then exit by themselves; those
        still running after the grace are stopped."""
        old = self.supervisor
        if old is None:
            return
        leaving = self._senders
        self._senders = []  # no new connection for the old ones: main serves them until the new ones are in
        self._retired.append(old)
        old.stop_restarting()  # its workers leave by themselves from here on
        self.supervisor = Supervisor(self._spec)
        await self.supervisor.start(self.count)
        await self._paired(self.count, PAIR_WAIT)  # so that the connections given back go to them
        await asyncio.gather(*(sender.finish() for sender in leaving))  # each reads its channel's end
        await old.stop(self._grace, leaving=self._grace)
        self._retired.remove(old)  # (a stop meanwhile stops what is left of them: `stop`)

    async def _paired(self, count: int, within: float) -> None:
        """Wait until `count` workers take connections, or `within` seconds have passed."""
        with contextlib.suppress(TimeoutError):
            async with self._pairing:
                await asyncio.wait_for(self._pairing.wait_for(lambda: len(self._senders) >= count), within)

    async def stop(self) -> None:
        self.front.share = None
        self._senders = []
        supervisors = [*self._retired, *([self.supervisor] if self.supervisor is not None else [])]
        await asyncio.gather(*(supervisor.stop(self._grace) for supervisor in supervisors))
        if self._control is not None:
            self._control.close()
        for channel in list(self.channels):
            channel.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    # ------------------------------------------------------------------ messages

    def _on_message(self, channel: Channel, message: Message) -> None:
        kind = message[0]
        if kind == "answered":
            report(Answered(*message[1]), self.app[REQUEST_OBSERVERS])
        elif kind == "rows":
            self._keep_rows(message[1])
        elif kind == "log":
            _, level, name, text = message
            seen = self.channels.get(channel)
            logging.getLogger(name).log(level, "worker %s: %s", "?" if seen is None else seen.index, text)
        elif kind == "settled":
            self._answered_settle(channel, message[1])
        elif kind == "hello":
            self.channels[channel] = WorkerSeen(message[1], message[2])
            channel.send(("profile", active_profile(self.state).name))
        else:
            if kind == "end" and channel in self.channels:
                self.channels[channel].served += 1
            self.grants.on_message(channel, message)

    def _on_lost(self, channel: Channel, error: BaseException | None) -> None:
        self.channels.pop(channel, None)
        for settle_id in list(self._settles):
            self._answered_settle(channel, settle_id)
        self.grants.on_lost(channel, error)

    async def settled(self) -> None:
        """Every worker's rows and answers so far have arrived (a worker that does not say so within
        SETTLE_WAIT seconds is not waited for longer)."""
        channels = set(self.channels)
        if not channels:
            return
        self._settle_ids += 1
        settle_id = self._settle_ids
        done = asyncio.get_running_loop().create_future()
        self._settles[settle_id] = (done, channels)
        for channel in channels:
            channel.send(("settle", settle_id))
        try:
            await asyncio.wait_for(asyncio.shield(done), SETTLE_WAIT)
        except TimeoutError:
            log.warning("a worker did not send its activity within %gs; read without it", SETTLE_WAIT)
        finally:
            self._settles.pop(settle_id, None)

    def _answered_settle(self, channel: Channel, settle_id: int) -> None:
        waiting = self._settles.get(settle_id)
        if waiting is None:
            return
        done, channels = waiting
        channels.discard(channel)
        if not channels and not done.done():
            done.set_result(None)

    def _keep_rows(self, rows: tuple[Any, ...]) -> None:
        recorder = recorder_of(self.state)
        for record, capture in rows:
            activity_id = recorder.next_id()
            recorder.keep(record_from(record, activity_id),
                          None if capture is None else capture_from(capture, activity_id))

    def _profile_changed(self, name: str | None) -> None:
        for channel in self.channels:
            channel.send(("profile", name))

    # ------------------------------------------------------------------ connections

    def _share(self) -> asyncio.Protocol | None:
        """Where a new connection goes: this process (None), or a worker's `_Passing`."""
        sender = self._next_owner()
        if sender is None:
            # Connections accepted together are shared before any of them is made (and counted open):
            # main counts the ones it keeps until then.
            if not self._keeping:
                asyncio.get_running_loop().call_soon(self._kept)
            self._keeping += 1
            return None
        return _Passing(sender, self._spawn, self._adopt_here)

    def _kept(self) -> None:
        self._keeping = 0  # those connections are made (and counted) right after this

    def _next_owner(self) -> HandOverSender | None:
        """The worker that takes the next connection, or None for this process (`Turns`)."""
        senders = self._senders
        held = self.front.runner.connection_server().open_connections + self._keeping
        index = self._turns.next(len(senders), held)
        return None if index is None else senders[index]

    async def _accept_hand_overs(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                channel, _ = await loop.sock_accept(listening)
                self._spawn(self._pair(channel))
        finally:
            listening.close()

    async def _pair(self, channel: socket.socket) -> None:
        """One worker's connection channel: connections go there in turn, and come back from there."""
        sender = HandOverSender(channel)
        if self._retired_worker(channel):  # a reload retired it before it got here: nothing goes to it
            self._spawn(sender.finish())
        else:
            self._senders.append(sender)
            async with self._pairing:
                self._pairing.notify_all()
        try:
            await receive_hand_overs(channel, self._adopt)
        except ConnectionError as exc:
            log.warning("a worker's connection channel broke: %s", exc)
        finally:
            if sender in self._senders:
                self._senders.remove(sender)
            channel.close()

    def _retired_worker(self, channel: socket.socket) -> bool:
        """Whether the worker at the other end of `channel` (the kernel says which process it is) is one of
        the workers a reload retired (two reloads in a row: the first one's new workers are the second's
        old ones, and may connect after it began)."""
        pid, _, _ = PEER_CREDENTIALS.unpack(
            channel.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEER_CREDENTIALS.size))
        return any(pid in supervisor.pids for supervisor in self._retired)

    def _adopt(self, sock: socket.socket, held: bytes) -> None:
        """A connection a worker gave back: with a request (`held`) that main serves, or idle (a retiring
        worker's), then shared anew like a new one."""
        owner = None if held else self._next_owner()
        if owner is not None:  # should that worker be going too, main serves it after all
            self._spawn(owner.pass_descriptor(sock.detach(), b"", self._adopt_here))
        else:
            self._adopt_here(sock, held)

    def _adopt_here(self, sock: socket.socket, held: bytes) -> None:
        front = self.front
        self._spawn(adopt_into(asyncio.get_running_loop(), sock, held, lambda: FrontConnection(front)))

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


@dataclass
class WorkerSeen:
    """A connected worker, as `GET /api/workers` shows it."""

    index: int
    pid: int
    served: int = 0  # its requests that ended


async def workers_route(request: web.Request) -> web.Response:
    """`GET /api/workers`: the worker processes serving beside this one now (none without --workers)."""
    workers: Workers | None = state(request).extras.get(WORKERS_KEY)
    seen = sorted(workers.channels.values(), key=lambda w: w.index) if workers is not None else []
    return web.json_response({"pid": os.getpid(), "workers": [
        {"index": w.index, "pid": w.pid, "served": w.served} for w in seen]})


def setup(app: web.Application) -> None:
    app.router.add_get("/api/workers", workers_route)


class _Passing(asyncio.Protocol):
    """A connection just accepted that a worker serves: it moves there before anything is read (or, should
    that worker be gone, is served here: `keep`)."""

    def __init__(self, sender: HandOverSender, spawn: Callable[[Any], None], keep: Adopt) -> None:
        self.sender = sender
        self.spawn = spawn
        self.keep = keep

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()
        self.spawn(self.sender.move(transport, b"", "a worker", self.keep))


def worker_argv(config_path: Path | None, config_dir: Path | None, host: str, log_level: str | None = None
                ) -> list[str]:
    """The command line of a worker: this Python, the same config sources, the listening host (for the
    guard), the log level given on main's command line."""
    argv = [sys.executable, "-m", "llmswap.server.worker_process", "--host", host]
    if log_level is not None:
        argv += ["--log-level", log_level]
    if config_path is not None:
        argv += ["--config", os.fspath(config_path)]
    if config_dir is not None:
        argv += ["--config-dir", os.fspath(config_dir)]
    return argv
