"""The channel's framing: hand-overs paired with their descriptors in order, however the reads split them."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from llmswap.workers.handover import HEADER, MAX_HELD, ChannelError, Frames


def message(held: bytes) -> bytes:
    return HEADER.pack(len(held)) + held


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.fixture
def fds() -> Iterator[list[int]]:
    """Real descriptors (pipe ends) to pass around; whatever a test leaves open is closed after it."""
    made: list[int] = []
    for _ in range(3):
        made.extend(os.pipe())
    yield made
    for fd in made:
        if is_open(fd):
            os.close(fd)


def test_several_hand_overs_in_one_read_come_out_in_order(fds: list[int]) -> None:
    frames = Frames()
    data = message(b"GET /a") + message(b"") + message(b"POST /c")

    assert frames.feed(data, fds[:3]) == [(fds[0], b"GET /a"), (fds[1], b""), (fds[2], b"POST /c")]
    assert not frames.partial


def test_a_message_split_across_reads_pairs_with_the_descriptor_of_its_first_bytes(fds: list[int]) -> None:
    frames = Frames()
    first, second = message(b"GET /first HTTP/1.1\r\n"), message(b"GET /second")
    data = first + second
    got = []
    for at in range(len(data)):  # one byte per read; each descriptor comes with its message's first byte
        attached = [fds[0]] if at == 0 else [fds[1]] if at == len(first) else []
        got += frames.feed(data[at:at + 1], attached)
        if at < len(first) - 1:
            assert got == [] and frames.partial

    assert got == [(fds[0], b"GET /first HTTP/1.1\r\n"), (fds[1], b"GET /second")]
    assert not frames.partial


def test_a_read_with_the_tail_of_one_message_and_the_head_of_the_next(fds: list[int]) -> None:
    frames = Frames()
    first, second = message(b"one"), message(b"two")
    assert frames.feed(first[:5], [fds[0]]) == []

    assert frames.feed(first[5:] + second[:2], [fds[1]]) == [(fds[0], b"one")]
    assert frames.feed(second[2:], []) == [(fds[1], b"two")]


def test_close_closes_the_descriptors_of_incomplete_messages(fds: list[int]) -> None:
    frames = Frames()
    frames.feed(message(b"whole") + message(b"cut short")[:6], fds[:2])

    frames.close()

    assert is_open(fds[0])  # given out with its complete message: the caller's now
    assert not is_open(fds[1])
    assert not frames.partial


def test_a_message_without_its_descriptor_breaks_the_channel(fds: list[int]) -> None:
    frames = Frames()
    with pytest.raises(ChannelError, match="without its connection"):
        frames.feed(message(b"a") + message(b"b"), [fds[0]])
    assert not is_open(fds[0])  # nothing is handed out of a broken stream; nothing leaks either


def test_an_impossible_length_breaks_the_channel(fds: list[int]) -> None:
    frames = Frames()
    with pytest.raises(ChannelError, match="out of step"):
        frames.feed(HEADER.pack(MAX_HELD + 1) + b"x", [fds[0]])
    assert not is_open(fds[0])
