"""The one forwarder (`llmswap.upstream.forward`) into a `Buffer`, as tasks, batches and probes use it: the
whole answer, an answer broken off (the sink is told, the connection is not reused), no answer at all
(`Unreachable`, the sink never started), the watchdog's 504 and a buffer's bound. Tiny scripted upstreams
on loopback."""

from __future__ import annotations

import asyncio

import pytest

from llmswap.config.model import Timeouts
from llmswap.upstream.client import Upstream
from llmswap.upstream.forward import Buffer, Unreachable, Watchdog, forward
from tests.helpers.scripted_upstream import Scripted, answer_each, ok, scripted, url


async def test_a_whole_answer_lands_in_the_buffer_and_its_connection_is_kept() -> None:
    async with scripted(answer_each) as up:
        pool = Upstream(Timeouts())
        for _ in range(2):
            buffer = Buffer()
            assert await forward(pool, "POST", url(up), {}, b"{}", buffer) is True
            assert (buffer.status, buffer.body, buffer.failure) == (200, b"hello", None)
        assert up.connections == 1
        await pool.close()


async def test_an_answer_broken_off_tells_the_sink_and_closes_its_connection() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Scripted) -> None:
        await up.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        await writer.drain()

    async with scripted(cut) as up:
        pool = Upstream(Timeouts())
        buffer = Buffer()
        assert await forward(pool, "POST", url(up), {}, b"{}", buffer, error_prefix="qwen") is False
        assert buffer.body == b"only this"
        assert buffer.failure is not None
        assert buffer.failure.startswith("qwen: the upstream broke off its answer")
        await pool.close()


async def test_no_answer_is_unreachable_and_the_sink_never_starts() -> None:
    async with scripted(answer_each) as up:
        port = url(up).port
    pool = Upstream(Timeouts())
    buffer = Buffer()
    with pytest.raises(Unreachable) as caught:
        await forward(pool, "GET", url(up), {}, None, buffer, error_prefix="peer proxy error")
    assert caught.value.status == 502 and buffer.status == 0
    assert caught.value.message.startswith(
        f"peer proxy error: ConnectFailed: cannot connect to 127.0.0.1:{port}")
    await pool.close()


async def test_the_watchdog_stops_a_silent_answer_with_504() -> None:
    async def silent_after_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                up: Scripted) -> None:
        await up.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nfirst")
        await up.wait_client_close(reader)

    async with scripted(silent_after_head) as up:
        pool = Upstream(Timeouts())
        buffer = Buffer()
        watchdog = Watchdog("models.m.timeouts", idle=0.05)
        assert await forward(pool, "GET", url(up), {}, None, buffer, watchdog=watchdog) is False
        assert buffer.failure is not None and "models.m.timeouts.idle" in buffer.failure
        await asyncio.wait_for(up.client_closed.wait(), 10)  # the upstream request was closed
        await pool.close()


async def test_a_bounded_buffer_keeps_its_first_bytes_and_says_it_dropped_the_rest() -> None:
    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Scripted) -> None:
        await up.read_request(reader)
        writer.write(ok(b"x" * 100_000))
        await up.wait_client_close(reader)

    async with scripted(big) as up:
        pool = Upstream(Timeouts())
        buffer = Buffer(limit=10)
        assert await forward(pool, "GET", url(up), {}, None, buffer) is True
        assert buffer.truncated and buffer.body == b"x" * 10
        await pool.close()
