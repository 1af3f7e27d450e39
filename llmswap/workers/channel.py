"""The control channel between the main process and one worker: messages as tuples of plain values, in
frames (a 4-byte little-endian length, then the tuple in `marshal`'s format), over a Unix-domain stream
socket.

`marshal` is the cheapest encoding Python has for tuples of numbers, strings and bytes, and it is safe here
only because nobody but main's own workers can write to the socket: it lives in a folder only llmswap's
user can enter (mode 0700, made by main), and a process of that user could do anything llmswap can anyway.
A frame larger than `max_frame`, or one that does not decode, ends the channel (`on_lost` with the reason):
a peer that sends either is broken.

Writes are coalesced: the messages sent during one turn of the event loop leave in one write, so a burst
of requests costs one system call each way, not one per message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import marshal
from collections.abc import Callable
from typing import Any

log = logging.getLogger("llmswap.workers")

Message = tuple[Any, ...]
MAX_FRAME = 64 * 1024 * 1024  # a capture's bodies travel in these; nothing legitimate comes near it


class ChannelBroken(Exception):
    """The peer sent something no llmswap process sends (an oversized or undecodable frame)."""


class Channel(asyncio.Protocol):
    """One end of the channel. `on_message(channel, message)` runs for each message, in order, on the loop;
    `on_lost(channel, error)` once, when the connection ends (`error`: None for a clean close)."""

    def __init__(self, on_message: Callable[[Channel, Message], None],
                 on_lost: Callable[[Channel, BaseException | None], None] | None = None, *,
                 max_frame: int = MAX_FRAME) -> None:
        self._on_message = on_message
        self._on_lost = on_lost
        self._max_frame = max_frame
        self._buffer = bytearray()
        self._outgoing: list[bytes] = []
        self._transport: asyncio.Transport | None = None
        self.closed = False
        self._leaving = False  # `leave` said no more comes from here
        self._gone: asyncio.Future[None] | None = None  # while leaving: set once the peer has closed too

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start, end = 0, len(buffer)
        try:
            while end - start >= 4:
                size = int.from_bytes(buffer[start : start + 4], "little")
                if size > self._max_frame:
                    raise ChannelBroken(f"a frame of {size} bytes (the limit is {self._max_frame})")
                if end - start - 4 < size:
                    break
                message = _decoded(buffer[start + 4 : start + 4 + size])
                start += 4 + size
                try:
                    self._on_message(self, message)
                except Exception:  # a bug in one handler must not end every request on the channel
                    log.exception("handling a %r message failed", message[0])
                if self.closed:
                    return
        except ChannelBroken as broken:
            self._break(broken)
            return
        finally:
            del buffer[:start]

    def send(self, message: Message) -> None:
        """Queue `message`; it leaves with the others sent in this turn of the loop. Dropped once closed (or
        leaving)."""
        if self.closed or self._leaving:
            return
        data = marshal.dumps(message)
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outgoing += (len(data).to_bytes(4, "little"), data)

    def _flush(self) -> None:
        outgoing, self._outgoing = self._outgoing, []
        if outgoing and self._transport is not None and not self.closed:
            self._transport.write(b"".join(outgoing))

    def close(self) -> None:
        """Send what is queued, then close."""
        self._flush()
        if self._transport is not None:
            self._transport.close()

    async def leave(self, within: float) -> None:
        """Close so that the peer sees a clean end: send what is queued, then the end of what this side
        sends, and wait (at most `within` seconds) until the peer, having read it, closes its side. What the
        peer sent meanwhile is still read and handled: closing with unread bytes in the socket would reset
        the connection, which the peer would take for a broken channel."""
        self._flush()
        transport = self._transport
        if transport is None or self.closed:
            return
        self._leaving = True
        gone = self._gone = asyncio.get_running_loop().create_future()
        try:
            transport.write_eof()
        except (OSError, RuntimeError):
            transport.close()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(gone), within)
        transport.close()

    def _break(self, error: BaseException) -> None:
        if self._transport is not None:
            self._transport.abort()
        self._lost(error)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(exc)

    def _lost(self, error: BaseException | None) -> None:
        if self.closed:
            return
        self.closed = True
        self._outgoing = []
        if self._gone is not None and not self._gone.done():
            self._gone.set_result(None)
        if self._on_lost is not None:
            self._on_lost(self, error)


def _decoded(frame: bytearray) -> Message:
    try:
        message = marshal.loads(frame)
    except (EOFError, ValueError, TypeError) as exc:
        raise ChannelBroken(f"a frame that does not decode ({exc})") from None
    if not isinstance(message, tuple) or not message:
        raise ChannelBroken(f"a frame that is not a message: {type(message).__name__}")
    return message
