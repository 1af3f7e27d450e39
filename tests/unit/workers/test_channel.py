"""The control channel's frames: whole messages in order however the bytes arrive, one write per loop turn,
and a peer that sends what no llmswap process sends ends the channel with the reason."""

from __future__ import annotations

import asyncio
import marshal
import socket

from llmswap.workers.channel import Channel, ChannelBroken, Message


def frame(message: object) -> bytes:
    data = marshal.dumps(message)
    return len(data).to_bytes(4, "little") + data


class Heard:
    def __init__(self, expect: int = 0) -> None:
        self.messages: list[Message] = []
        self.lost: list[BaseException | None] = []
        self.expect = expect
        self.all_in = asyncio.Event()  # `expect` messages came
        self.ended = asyncio.Event()

    def channel(self, **options: int) -> Channel:
        return Channel(self._message, self._lost, **options)

    def _message(self, _: Channel, message: Message) -> None:
        self.messages.append(message)
        if len(self.messages) == self.expect:
            self.all_in.set()

    def _lost(self, _: Channel, error: BaseException | None) -> None:
        self.lost.append(error)
        self.ended.set()


class Transport:
    """The little of a transport a channel that breaks uses (no loop needed to parse)."""

    aborted = False

    def abort(self) -> None:
        self.aborted = True


def test_messages_split_across_reads_or_several_in_one_read_arrive_whole_and_in_order() -> None:
    heard = Heard()
    channel = heard.channel()
    stream = frame(("lease", 1, "a", b"\x00" * 300)) + frame(("end", 1, None)) + frame(("end", 2, "gone"))
    for i in range(0, 10):  # byte by byte at first
        channel.data_received(stream[i : i + 1])
    channel.data_received(stream[10:])  # then the rest at once, two and a half frames before it
    assert heard.messages == [("lease", 1, "a", b"\x00" * 300), ("end", 1, None), ("end", 2, "gone")]
    assert heard.lost == []


def test_an_oversized_frame_ends_the_channel_and_says_why() -> None:
    heard = Heard()
    channel = heard.channel(max_frame=100)
    transport = Transport()
    channel.connection_made(transport)  # type: ignore[arg-type]
    channel.data_received(frame(("ok",)) + (101).to_bytes(4, "little"))
    assert heard.messages == [("ok",)]
    [error] = heard.lost
    assert isinstance(error, ChannelBroken) and "101 bytes" in str(error) and transport.aborted
    channel.data_received(frame(("later",)))
    channel.connection_lost(None)
    assert heard.messages == [("ok",)] and len(heard.lost) == 1, "nothing after the break, one end"


def test_a_frame_that_is_not_a_message_ends_the_channel() -> None:
    for garbage in (b"\xff\xfe\xfd", marshal.dumps([1, 2]), marshal.dumps(())):
        heard = Heard()
        channel = heard.channel()
        channel.connection_made(Transport())  # type: ignore[arg-type]
        channel.data_received(len(garbage).to_bytes(4, "little") + garbage)
        [error] = heard.lost
        assert isinstance(error, ChannelBroken) and heard.messages == []


async def test_the_messages_sent_in_one_loop_turn_leave_in_one_write_and_arrive_in_order() -> None:
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    heard = Heard(expect=50)
    transport, sender = await loop.create_unix_connection(lambda: Channel(lambda *_: None), sock=ours)
    await loop.create_unix_connection(heard.channel, sock=theirs)
    writes: list[bytes] = []
    write = transport.write

    def counted(data: bytes) -> None:
        writes.append(data)
        write(data)

    transport.write = counted  # type: ignore[method-assign]
    for rid in range(50):
        sender.send(("lease", rid, "a"))
    assert writes == [], "nothing leaves before the turn ends"
    await heard.all_in.wait()
    assert len(writes) == 1 and heard.messages == [("lease", rid, "a") for rid in range(50)]
    sender.close()
    await heard.ended.wait()
    assert heard.lost == [None], "a clean close is no error"
    sender.send(("dropped",))  # closed: nothing happens
    await asyncio.sleep(0)
    assert len(writes) == 1


async def test_leaving_with_the_peers_messages_unread_is_a_clean_end_for_both() -> None:
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    mine, peer = Heard(), Heard()
    _, leaving = await loop.create_unix_connection(mine.channel, sock=ours)
    _, staying = await loop.create_unix_connection(peer.channel, sock=theirs)
    staying.send(("settle", 1))  # in flight towards the side that leaves: closing now would reset
    leaving.send(("rows", ()))

    await asyncio.wait_for(leaving.leave(5), 5)

    assert peer.messages == [("rows", ())] and peer.lost == [None], "the staying side saw a clean end"
    assert mine.messages == [("settle", 1)] and mine.lost == [None]
    leaving.send(("dropped",))  # gone: nothing happens
    await asyncio.sleep(0)
    assert peer.messages == [("rows", ())]


def test_a_handler_that_fails_on_one_message_does_not_end_the_channel() -> None:
    heard: list[Message] = []

    def handle(_: Channel, message: Message) -> None:
        if message[0] == "bad":
            raise RuntimeError("a bug in a handler")
        heard.append(message)

    channel = Channel(handle)
    channel.data_received(frame(("bad",)) + frame(("good", 1)))
    channel.data_received(frame(("good", 2)))
    assert heard == [("good", 1), ("good", 2)] and not channel.closed
