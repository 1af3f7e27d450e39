"""Moving an accepted client connection from a worker process to main: its file descriptor and the bytes the
worker already read, over a Unix-domain stream socket (the channel) with SCM_RIGHTS.

A worker serves only the front's fast requests; at any other request it gives the whole connection to main,
as the front gives one to aiohttp inside a process (`llmswap.server.front.site.Front.hand_over`). Main then
reads the held bytes first and the socket after them, so it sees the client's bytes exactly as sent.

The sender (`HandOverSender.hand_over`, in the worker) takes the connection from its asyncio transport
without ending it: it stops reading, swaps in a protocol of its own (the caller's protocol hears nothing
more), waits until the transport has written out every answer already given (main's answers must not
overtake them), duplicates the socket's descriptor and only then closes the transport. Closing a descriptor
never sends FIN or RST while another one refers to the same socket: the kernel ends a TCP connection when
the last reference goes, or at `shutdown()`, which neither asyncio's `close()` nor `abort()` calls. The
duplicate travels to main; once `sendmsg` has returned, the message in the channel holds its own
reference, so the worker closes the duplicate too and the connection lives on in main alone.

A message on the channel is a 4-byte big-endian length, then that many held bytes; the descriptor rides on
the first `sendmsg` of its message, so it reaches the reader with the message's first bytes (Linux gives a
`recvmsg` the descriptors of at most one such write, and stops reading after it). Every message carries
exactly one descriptor, so the reader pairs them in order (`Frames`): several hand-overs in one read and a
message split across reads both come out right.

Plain TCP only: a TLS session's keys and sequence numbers live in the worker's memory, so a TLS connection
cannot move to another process; `hand_over` refuses one (`NotMovable`) before touching it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

log = logging.getLogger("llmswap.workers")

HEADER = struct.Struct("!I")  # the held bytes' length
MAX_HELD = 64 * 1024 * 1024  # a longer message is a broken channel, not a request
READ_SIZE = 256 * 1024  # bytes asked of one recvmsg on the channel
MAX_FDS = 8  # descriptors one recvmsg accepts (the kernel gives at most one message's: one)

P = TypeVar("P", bound=asyncio.Protocol)
Adopt = Callable[[socket.socket, bytes], None]


class NotMovable(ValueError):
    """The connection cannot move to another process (TLS, or no socket under the transport)."""


class ChannelError(ConnectionError):
    """The channel's stream no longer makes sense (a bad length, a message without its descriptor, lost
    descriptors, a message half sent): nothing more can be read or sent on it."""


# -------------------------------------------------------------------------------------------- the worker

class _Moving(asyncio.Protocol):
    """The protocol of a transport whose connection is leaving: it reads nothing and tells the sender when
    the write buffer is empty, or that the client went away meanwhile."""

    def __init__(self) -> None:
        self.gone = False
        self._waiter: asyncio.Future[None] | None = None

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def eof_received(self) -> bool:
        return True  # reading is paused, so this cannot come; if it did, keep the connection for main

    async def drained(self, transport: asyncio.WriteTransport) -> None:
        """Return once the transport has no unwritten byte; ConnectionResetError if the client left."""
        # A high-water mark of 0 makes the transport call resume_writing the moment its buffer is empty,
        # whether or not the previous protocol had writing paused.
        transport.set_write_buffer_limits(high=0)
        while transport.get_write_buffer_size() and not self.gone:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        if self.gone:
            raise ConnectionResetError("the client closed the connection before it could move")


async def detach(transport: asyncio.Transport) -> int:
    """Take the connection out of `transport`: return a descriptor of its own socket (the caller closes
    it) and close the transport, leaving the connection itself open and its unread bytes in the kernel.

    Raises NotMovable for a TLS or socketless transport (left as it was), ConnectionResetError when the
    client leaves before the answers already written are out. From the call on, the transport's protocol
    is not called again; if the call fails or is cancelled after that point, the connection is closed
    (the client sees it end rather than hang).
    """
    if transport.get_extra_info("ssl_object") is not None:
        raise NotMovable("a TLS connection cannot move to another process: its session lives in this one")
    sock = transport.get_extra_info("socket")
    if sock is None or sock.type != socket.SOCK_STREAM:
        raise NotMovable("only a stream socket's connection can move to another process")
    if transport.is_closing():
        raise ConnectionResetError("the connection is already closing")
    transport.pause_reading()  # what the client sends next stays in the kernel, for main to read
    moving = _Moving()
    transport.set_protocol(moving)
    try:
        await moving.drained(transport)
        fd = os.dup(sock.fileno())  # before close(): the transport's own descriptor goes with it
    finally:
        transport.close()  # closes the transport's descriptor only: no shutdown(), so no FIN
    return fd


class HandOverSender:
    """One end of a channel between main and a worker: moves connections to the other end, one whole
    message at a time (a worker gives main the requests it does not serve; main passes new connections to a
    worker, and `finish`es when a reload retires it).

    The channel is a connected AF_UNIX stream socket carrying hand-overs and nothing else; it is made
    non-blocking and stays the caller's to close. Concurrent hand-overs queue on a lock so that their
    messages never interleave.
    """

    def __init__(self, channel: socket.socket) -> None:
        channel.setblocking(False)
        self.channel = channel
        self._lock = asyncio.Lock()
        self._broken = False
        self._busy: set[asyncio.Task[object]] = set()  # the tasks moving or sending a connection now
        self._last: set[asyncio.Task[object]] | None = None  # once finishing: the ones still let through

    async def finish(self) -> None:
        """No connection goes this way after the ones under way (a later one is refused: ChannelError);
        once those are sent, the other end reads the channel's end (its write side is shut; what comes
        back on it still arrives)."""
        current = asyncio.current_task()
        self._last = {task for task in self._busy if task is not current}
        await asyncio.gather(*self._last, return_exceptions=True)
        async with self._lock:
            with contextlib.suppress(OSError):
                self.channel.shutdown(socket.SHUT_WR)

    @contextlib.contextmanager
    def _under_way(self) -> Iterator[None]:
        """The current task moves or sends a connection for the duration (what `finish` waits for)."""
        task = asyncio.current_task()
        if task is None or task in self._busy:  # already counted (a move sends)
            yield
            return
        self._busy.add(task)
        try:
            yield
        finally:
            self._busy.discard(task)

    async def hand_over(self, transport: asyncio.Transport, held: bytes, keep: Adopt | None = None) -> None:
        """Give the other end the connection under `transport`, to be served from `held` (the bytes read
        from it that the other end must see first) on. See `detach` for what happens to the transport and
        what is raised; OSError when the channel fails: the connection then goes to `keep(sock, held)` (it
        is served here after all), or without one is closed (nobody could serve it)."""
        if len(held) > MAX_HELD:
            raise NotMovable(f"{len(held)} held bytes are more than a hand-over carries ({MAX_HELD})")
        await self.pass_descriptor(await detach(transport), held, keep)

    async def pass_descriptor(self, fd: int, held: bytes, keep: Adopt | None = None) -> None:
        """Give the other end the connection of descriptor `fd` (this call's to close), to be served from
        `held` on; OSError when the channel fails, unless `keep(sock, held)` then serves it here."""
        kept = False
        try:
            await self.send(fd, held)
        except OSError:
            if keep is None:
                raise
            log.info("a connection could not move (the other end is gone); it is served here")
            kept = True
            keep(socket.socket(fileno=fd), held)
        finally:
            if not kept:
                os.close(fd)  # the other end has its own reference now (or nobody could serve it)

    async def move(self, transport: asyncio.Transport, held: bytes, to: str, keep: Adopt | None = None
                   ) -> None:
        """`hand_over`, and when the connection cannot move (nor be kept), say so and close it: nobody
        could serve it (`to`: where it was going, for the log)."""
        try:
            with self._under_way():
                await self.hand_over(transport, held, keep)
        except (NotMovable, OSError) as exc:
            log.warning("a connection could not move to %s (%s); it is closed", to, exc)
            transport.abort()

    async def send(self, fd: int, held: bytes) -> None:
        """Send one message: the descriptor `fd` (still the caller's to close) and `held`."""
        if len(held) > MAX_HELD:
            raise ValueError(f"{len(held)} held bytes are more than a hand-over carries ({MAX_HELD})")
        message = HEADER.pack(len(held)) + held
        loop = asyncio.get_running_loop()
        with self._under_way():
            await self._send(loop, message, fd)

    async def _send(self, loop: asyncio.AbstractEventLoop, message: bytes, fd: int) -> None:
        async with self._lock:
            if self._broken:
                raise ChannelError("the channel to main broke in the middle of a hand-over")
            if self._last is not None and asyncio.current_task() not in self._last:
                raise ChannelError("the channel takes no more connections")
            while True:
                try:
                    sent = socket.send_fds(self.channel, [message], [fd])
                    break
                except BlockingIOError:
                    await _ready(loop, self.channel, write=True)
            if sent < len(message):
                try:
                    await loop.sock_sendall(self.channel, memoryview(message)[sent:])
                except BaseException:
                    self._broken = True  # a message half sent: the next one would be read as its rest
                    raise


# -------------------------------------------------------------------------------------------- main

class Frames:
    """Splits the channel's bytes into hand-overs, pairing each message with its descriptor in order.

    A descriptor arrives with the first bytes of its message, so when a message is complete its descriptor
    is the oldest one not yet paired. Descriptors not yet paired are closed by `close()`.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._fds: deque[int] = deque()

    @property
    def partial(self) -> bool:
        """Whether some of a message (or a descriptor) arrived and the rest has not."""
        return bool(self._buffer or self._fds)

    def feed(self, data: bytes, fds: Sequence[int]) -> list[tuple[int, bytes]]:
        """Take one read's bytes and descriptors; return the hand-overs now complete, as (fd, held).

        Raises ChannelError for a stream that cannot be ours; the descriptors it held are closed then.
        """
        self._fds.extend(fds)
        self._buffer += data
        buffer = self._buffer
        complete: list[tuple[int, bytes]] = []
        try:
            while len(buffer) >= HEADER.size:
                (length,) = HEADER.unpack_from(buffer)
                if length > MAX_HELD:
                    raise ChannelError(f"a hand-over of {length} bytes: the channel is out of step")
                end = HEADER.size + length
                if len(buffer) < end:
                    break
                if not self._fds:
                    raise ChannelError("a hand-over arrived without its connection")
                complete.append((self._fds.popleft(), bytes(buffer[HEADER.size:end])))
                del buffer[:end]
        except ChannelError:
            for fd, _ in complete:
                os.close(fd)
            self.close()
            raise
        return complete

    def close(self) -> None:
        """Close the descriptors of messages not complete, and forget their bytes."""
        while self._fds:
            os.close(self._fds.popleft())
        self._buffer.clear()


async def receive_hand_overs(channel: socket.socket, adopt: Adopt) -> None:
    """Read hand-overs from one worker's channel until the worker closes its end, calling `adopt(sock,
    held)` for each: `sock` is the client's connection (main's to close), `held` the bytes to serve first.

    Returns at the channel's end; raises ChannelError when its stream breaks. Cancel it to stop reading.
    A connection whose message had not fully arrived is closed. The channel stays the caller's to close.
    """
    loop = asyncio.get_running_loop()
    channel.setblocking(False)
    frames = Frames()
    try:
        while True:
            try:
                data, fds, flags, _ = socket.recv_fds(channel, READ_SIZE, MAX_FDS)
            except BlockingIOError:
                await _ready(loop, channel, write=False)
                continue
            if flags & socket.MSG_CTRUNC:
                for fd in fds:
                    os.close(fd)
                raise ChannelError("descriptors were lost on the channel (more in one read than expected)")
            if not data and not fds:
                if frames.partial:
                    log.warning("a worker's channel ended in the middle of a hand-over: "
                                "that connection is lost")
                return
            for fd, held in frames.feed(data, fds):
                _adopt(adopt, fd, held)
    finally:
        frames.close()


def _adopt(adopt: Adopt, fd: int, held: bytes) -> None:
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        log.exception("a handed-over descriptor is not a socket")
        return
    try:
        adopt(sock, held)
    except Exception:
        sock.close()
        log.exception("adopting a handed-over connection failed; it is closed")


class _Starter(asyncio.Protocol, Generic[P]):
    """The first protocol of an adopted transport: at connection_made it puts the real one in its place
    and feeds it the held bytes, before the transport can deliver anything it reads from the socket."""

    def __init__(self, protocol_factory: Callable[[], P], held: bytes) -> None:
        self._factory = protocol_factory
        self._held = held
        self.protocol: P | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        protocol = self.protocol = self._factory()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        held, self._held = self._held, b""
        if held:
            protocol.data_received(held)


async def adopt_into(
    loop: asyncio.AbstractEventLoop,
    sock: socket.socket,
    held: bytes,
    protocol_factory: Callable[[], P],
) -> tuple[asyncio.Transport, P]:
    """Serve a handed-over connection in this process: a transport for `sock` with a protocol from
    `protocol_factory`, which gets `held` as its first `data_received`, then what the socket brings."""
    starter = _Starter(protocol_factory, held)
    transport, _ = await loop.connect_accepted_socket(lambda: starter, sock)
    if starter.protocol is None:  # the loop returned before connection_made: not asyncio's contract
        transport.abort()
        raise RuntimeError("the event loop returned an adopted transport before it was connected")
    return transport, starter.protocol


async def _ready(loop: asyncio.AbstractEventLoop, sock: socket.socket, *, write: bool) -> None:
    """Wait until `sock` can be written (or read) without blocking."""
    ready: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    if write:
        loop.add_writer(fd, wake)
    else:
        loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        with contextlib.suppress(ValueError, OSError):  # the socket was closed meanwhile
            if write:
                loop.remove_writer(fd)
            else:
                loop.remove_reader(fd)
