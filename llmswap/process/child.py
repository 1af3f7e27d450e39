"""One spawned OS process: its own session, a parent-death signal, its output line by line, its exit noticed
the instant it happens, and signals sent to its whole process group.

Why not `asyncio.create_subprocess_exec`: its `wait()` only returns once the child's pipes are closed, and a
grandchild that inherited them keeps them open after the child itself has died, so a crashed upstream would
go unnoticed. Here the exit comes from a pidfd (Linux >= 5.3; a waiting thread elsewhere) and the pipe is
read separately.

Parent-death signal (Linux): the child runs `prctl(PR_SET_PDEATHSIG, SIGKILL)` between fork and exec, so
the kernel kills it when the proxy dies, even by SIGKILL, where no cleanup code of ours can run. The kernel
ties that signal to the *thread* that forked, not to the process: children are forked by the spawner
(`spawner`), one thread that lives as long as the proxy does, never by a worker thread that may exit. It
covers the direct child only; the child's own children are killed with its process group by a normal stop,
and by the child's keeper (`keeper.py`) when the proxy dies.

Why a thread of its own and not the event loop's: the preexec function rules out vfork, and `Popen` returns
only once the child has run it and exec'd; on a busy machine that held the loop, and every request on it,
for 124 ms (a start measured under the test suite run two ways at once; a few ms on an idle machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from llmswap.process.keeper import Keeper, start_keeper

logger = logging.getLogger("llmswap.process")

MAX_LINE_BYTES = 16 * 1024  # a longer line is split rather than buffered without bound
_PR_SET_PDEATHSIG = 1

LineSink = Callable[[str], None]


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


# Resolved once, before any fork: the forked child should only call it, not look symbols up.
_prctl = _load_prctl()


def parent_death_signal() -> Callable[[], None] | None:
    """A preexec function arming SIGKILL-on-parent-death in the child, or None where it does not exist."""
    prctl = _prctl
    if prctl is None:
        return None
    parent = os.getpid()
    kill = int(signal.SIGKILL)

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, kill, 0, 0, 0)
        if os.getppid() != parent:  # the proxy died between fork and prctl: nobody would kill us later
            os._exit(1)

    return arm


class _LineReader(asyncio.Protocol):
    """Splits a pipe's bytes into lines for `sink`; resolves `eof` when every writer has closed the pipe."""

    def __init__(self, sink: LineSink, eof: asyncio.Future[None]) -> None:
        self._sink = sink
        self._eof = eof
        self._buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while (end := self._buffer.find(b"\n")) >= 0:
            self._emit(bytes(self._buffer[:end]))
            del self._buffer[: end + 1]
        while len(self._buffer) > MAX_LINE_BYTES:
            self._emit(bytes(self._buffer[:MAX_LINE_BYTES]))
            del self._buffer[:MAX_LINE_BYTES]

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._buffer:
            self._emit(bytes(self._buffer))
            self._buffer.clear()
        if not self._eof.done():
            self._eof.set_result(None)

    def _emit(self, raw: bytes) -> None:
        try:
            self._sink(raw.decode("utf-8", errors="replace").rstrip("\r"))
        except Exception:
            logger.exception("log sink failed on an upstream output line")


def _watch_exit(loop: asyncio.AbstractEventLoop, popen: subprocess.Popen[bytes]) -> asyncio.Future[int]:
    """A future resolved with the exit status (negative: killed by that signal) as soon as the child dies."""
    exited: asyncio.Future[int] = loop.create_future()

    def resolve(returncode: int) -> None:
        if not exited.done():
            exited.set_result(returncode)

    try:
        pidfd = os.pidfd_open(popen.pid)
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is not None:

        def on_pidfd_readable() -> None:
            returncode = popen.poll()  # reaps the child
            if returncode is None:
                return
            loop.remove_reader(pidfd)
            os.close(pidfd)
            resolve(returncode)

        loop.add_reader(pidfd, on_pidfd_readable)
        return exited

    def wait_in_thread() -> None:
        returncode = popen.wait()
        with contextlib.suppress(RuntimeError):  # the loop is already closed: nobody is waiting any more
            loop.call_soon_threadsafe(resolve, returncode)

    threading.Thread(target=wait_in_thread, name=f"wait-{popen.pid}", daemon=True).start()
    return exited


class Child:
    """A running (or finished) child process, leader of its own process group."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        exited: asyncio.Future[int],
        eof: asyncio.Future[None],
        transport: asyncio.BaseTransport | None,
        keeper: Keeper | None = None,
    ) -> None:
        self._popen = popen
        self.exited = exited
        self._eof = eof
        self._transport = transport
        self._keeper = keeper

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self.exited.result() if self.exited.done() else None

    def signal_group(self, sig: int) -> bool:
        """Send `sig` to every process in the child's group; False when none is left."""
        try:
            os.killpg(self.pid, sig)
            return True
        except ProcessLookupError:
            pass
        except PermissionError:
            logger.warning("not allowed to signal process group %d", self.pid)
        # The child left its group (setpgid/setsid of its own). Signal it alone, but only while it is
        # unreaped: after that its pid may already belong to somebody else.
        if not self.exited.done():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, sig)
                return True
        return False

    async def wait_exit(self, within: float | None) -> bool:
        if not self.exited.done():
            await asyncio.wait({self.exited}, timeout=within)
        return self.exited.done()

    async def close(self, drain_timeout: float) -> None:
        """Read what is left in the pipe (bounded: an escaped grandchild may hold it open), then close it."""
        if not self._eof.done():
            await asyncio.wait({self._eof}, timeout=drain_timeout)
        self.abandon_pipe()

    def abandon_pipe(self) -> None:
        """Let go of the child for good (it was stopped and its group killed): close the output pipe and
        stand its keeper down."""
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        if self._keeper is not None:
            self._keeper.stand_down()
            self._keeper = None


@functools.cache
def spawner() -> ThreadPoolExecutor:
    """The one thread children are forked from (see the module's doc): made on the first spawn, it lives
    until the interpreter exits, as the parent-death signal needs. Process-wide by nature, like the signal
    it serves. Asked for on event-loop threads only."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmswap-spawner")


def _popen(argv: Sequence[str], env: Mapping[str, str], keeper: bool) -> tuple[subprocess.Popen[bytes],
                                                                              Keeper | None]:
    """On the spawner's thread: the child, and its keeper."""
    popen = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(env),
        start_new_session=True,
        preexec_fn=parent_death_signal(),
    )
    return popen, start_keeper(popen.pid) if keeper else None


def _end_unwanted(spawned: asyncio.Future[tuple[subprocess.Popen[bytes], Keeper | None]]) -> None:
    """A spawn whose caller was cancelled while the child started: its group is killed and reaped."""
    if spawned.cancelled() or spawned.exception() is not None:
        return
    popen, guard = spawned.result()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)
    if guard is not None:
        guard.stand_down()
    assert popen.stdout is not None
    popen.stdout.close()
    spawner().submit(popen.wait)  # reaped there: SIGKILL makes it quick


async def spawn_child(
    argv: Sequence[str], *, env: Mapping[str, str], on_line: LineSink, keeper: bool = True
) -> Child:
    """Start `argv` (no shell) in its own session, stdout and stderr merged into `on_line`; with `keeper`,
    a keeper that ends the session's group if the proxy dies. Forked on the spawner's thread, so the event
    loop goes on meanwhile; a caller cancelled meanwhile leaves no child behind.

    Raises OSError or subprocess.SubprocessError when it cannot be started. Call from the event loop.
    """
    loop = asyncio.get_running_loop()
    spawned = loop.run_in_executor(spawner(), _popen, argv, env, keeper)
    try:
        popen, guard = await asyncio.shield(spawned)
    except asyncio.CancelledError:
        spawned.add_done_callback(_end_unwanted)
        raise
    exited = _watch_exit(loop, popen)
    eof: asyncio.Future[None] = loop.create_future()
    assert popen.stdout is not None
    try:
        transport, _ = await loop.connect_read_pipe(lambda: _LineReader(on_line, eof), popen.stdout)
    except BaseException:
        failed = Child(popen, exited, eof, None, guard)
        failed.signal_group(signal.SIGKILL)
        failed.abandon_pipe()
        popen.stdout.close()
        raise
    return Child(popen, exited, eof, transport, guard)
