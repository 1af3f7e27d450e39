"""The upstream HTTP/1.1 client on real loopback sockets: bodies relayed as they arrive (chunked, sized,
delimited by the close), back-pressure, keep-alive reuse, connections the upstream closed (idle, or by
restarting), abandoned answers closing their connection, the response-header timeout, and exactly the
caller's headers going out.

Most upstreams here are tiny asyncio servers scripted by the test (`tests.helpers.scripted_upstream`); the
restart test kills and restarts a real demo upstream on the same port; the https one serves a certificate
made for it with the openssl command.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from multidict import CIMultiDict
from yarl import URL

from llmswap.config.model import Timeouts
from llmswap.dispatch import http1
from llmswap.dispatch.http1 import Attempt, ConnectFailed, Upstream, UpstreamClosed, UpstreamProtocolError
from llmswap.dispatch.http1_connection import HIGH_WATER
from llmswap.dispatch.pool import send
from tests.helpers.demo import running_demo
from tests.helpers.scripted_upstream import Scripted, answer_each, ok, scripted, url
from tests.helpers.wait import eventually


async def test_a_sized_answer_is_read_and_its_connection_reused_with_tcp_keep_alive_probes() -> None:
    async with scripted(answer_each) as up:
        pool = Upstream(Timeouts())
        first, second = Attempt(), Attempt()
        for attempt in (first, second):
            async with await pool.request("POST", url(up), {"Content-Type": "application/json"}, b"{}",
                                          attempt) as answer:
                assert (answer.status, answer.reason) == (200, "OK")
                assert answer.headers.get("content-length") == "5"
                assert await answer.read() == b"hello"
        assert up.connections == 1
        [connection] = pool._idle[("http", "127.0.0.1", url(up).port or 0)]
        assert connection.transport is not None
        sock = connection.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1  # timeouts.keepalive: 30 s
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
        assert (first.reused, first.handed_over) == (False, True)
        assert (second.reused, second.handed_over) == (True, True)


async def test_a_chunked_answer_is_handed_over_chunk_by_chunk_as_it_arrives() -> None:
    go_on = asyncio.Event()

    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Scripted) -> None:
        while True:
            await up.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
            await go_on.wait()  # the second chunk only after the client has the first
            go_on.clear()
            writer.write(b"6\r\nsecond\r\n0\r\n\r\n")

    async with scripted(chunked) as up:
        pool = Upstream(Timeouts())
        for _ in range(2):
            answer = await pool.request("GET", url(up), {}, None)
            assert await answer.read_chunk() == b"first"
            go_on.set()
            assert await answer.read_chunk() == b"second"
            assert await answer.read_chunk() == b""
            answer.release()
        assert up.connections == 1


async def test_an_answer_delimited_by_the_close_ends_there_and_its_connection_is_not_kept() -> None:
    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Scripted) -> None:
        await up.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\npart one, ")
        await writer.drain()
        writer.write(b"part two")

    async with scripted(until_close) as up:
        pool = Upstream(Timeouts())
        async with await pool.request("GET", url(up), {}, None) as answer:
            assert await answer.read() == b"part one, part two"
        assert pool.idle_count() == 0


async def test_an_answer_the_upstream_breaks_off_raises_after_the_bytes_that_came() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Scripted) -> None:
        await up.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")

    async with scripted(cut) as up:
        answer = await Upstream(Timeouts()).request("GET", url(up), {}, None)
        assert await answer.read_chunk() == b"only this"
        with pytest.raises(UpstreamClosed):
            await answer.read_chunk()
        answer.close()


async def test_bytes_that_are_not_http_fail_the_request() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Scripted) -> None:
        await up.read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await up.wait_client_close(reader)

    async with scripted(garbage) as up:
        with pytest.raises(UpstreamProtocolError):
            await Upstream(Timeouts()).request("GET", url(up), {}, None)


async def test_an_interim_answer_is_skipped_and_a_switch_of_protocols_nobody_asked_for_fails() -> None:
    async def interim(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Scripted) -> None:
        await up.read_request(reader)
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n" + ok(b"final"))
        await up.read_request(reader)
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        await up.wait_client_close(reader)

    async with scripted(interim) as up:
        pool = Upstream(Timeouts())
        async with await pool.request("GET", url(up), {}, None) as answer:
            assert answer.status == 200 and "Link" not in answer.headers
            assert await answer.read() == b"final"
        with pytest.raises(UpstreamProtocolError):
            await pool.request("GET", url(up), {}, None)


async def test_a_slow_reader_pauses_the_upstream_and_still_gets_every_byte() -> None:
    total = 16 * 1024 * 1024
    block = b"x" * 65536

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Scripted) -> None:
        await up.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        for _ in range(total // len(block)):
            writer.write(block)
            await writer.drain()

    async with scripted(flood) as up:
        answer = await Upstream(Timeouts()).request("GET", url(up), {}, None)
        connection = answer._connection
        assert connection is not None
        await eventually(lambda: _true(connection.paused), what="reading the upstream to pause")
        assert connection.buffered < HIGH_WATER + len(block) * 2  # bounded while nobody reads
        received = 0
        while chunk := await answer.read_chunk():
            received += len(chunk)
        assert received == total
        answer.release()


async def _true(value: bool) -> bool:
    return value


async def test_a_connection_the_upstream_closed_while_idle_leaves_the_pool_and_fails_nothing() -> None:
    async def answer_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                up: Scripted) -> None:
        await up.read_request(reader)
        writer.write(ok(b"hello"))  # keep-alive by default, then closed while idle
        await writer.drain()

    async with scripted(answer_then_close) as up:
        pool = Upstream(Timeouts())
        async with await send(pool, "POST", url(up), {}, b"{}", 0) as answer:
            assert await answer.read() == b"hello"
        await eventually(lambda: _true(pool.idle_count() == 0),
                         what="the pool dropping the closed connection")
        async with await send(pool, "POST", url(up), {}, b"{}", 0) as answer:
            assert await answer.read() == b"hello"
        assert up.connections == 2


async def test_a_connection_idle_longer_than_idle_conn_is_closed() -> None:
    async def answer_then_watch(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                up: Scripted) -> None:
        await up.read_request(reader)
        writer.write(ok(b"hello"))
        await up.wait_client_close(reader)

    async with scripted(answer_then_watch) as up:
        pool = Upstream(Timeouts(idle_conn=0.05))
        async with await pool.request("GET", url(up), {}, None) as answer:
            assert await answer.read() == b"hello"
        assert pool.idle_count() == 1
        await asyncio.wait_for(up.client_closed.wait(), 10)
        assert pool.idle_count() == 0


async def test_a_pooled_connection_to_an_upstream_that_restarted_is_replaced() -> None:
    async with running_demo("r") as demo:
        port = demo.port
        pool = Upstream(Timeouts())
        target = URL(f"{demo.url}/v1/models")
        async with await send(pool, "GET", target, {}, None, 0) as answer:
            assert answer.status == 200 and b'"r"' in await answer.read()
        assert pool.idle_count() == 1
        await demo.kill()
    async with running_demo("r", port=port) as demo:
        chat = b'{"model": "r", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
        async with await send(pool, "POST", URL(f"{demo.url}/v1/chat/completions"),
                              {"Content-Type": "application/json"}, chat, 0) as answer:
            assert answer.status == 200, await answer.read()
            assert b"chat.completion" in await answer.read()


async def test_an_abandoned_answer_closes_its_connection_and_the_upstream_sees_it() -> None:
    async def streaming(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Scripted) -> None:
        await up.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\ntoken\r\n")
        await up.wait_client_close(reader)

    async with scripted(streaming) as up:
        pool = Upstream(Timeouts())
        answer = await pool.request("POST", url(up), {}, b"{}")
        assert await answer.read_chunk() == b"token"
        answer.close()
        await asyncio.wait_for(up.client_closed.wait(), 10)
        assert pool.idle_count() == 0


async def test_no_headers_within_the_response_header_limit_is_a_timeout_that_closes_the_connection() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Scripted) -> None:
        await up.read_request(reader)
        await up.wait_client_close(reader)

    async with scripted(silent) as up:
        pool = Upstream(Timeouts())
        with pytest.raises(TimeoutError):
            await send(pool, "POST", url(up), {}, b"{}", 0.05)
        await asyncio.wait_for(up.client_closed.wait(), 10)
        assert pool.idle_count() == 0


async def test_only_the_callers_headers_go_out_with_host_and_length_and_bytes_stay_encoded() -> None:
    gzipped = b"\x1f\x8b\x08\x00fake-gzip-bytes"

    async def encoded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Scripted) -> None:
        while True:
            await up.read_request(reader)
            writer.write(ok(gzipped, b"Content-Encoding: gzip\r\nSet-Cookie: a=1\r\n"))

    async with scripted(encoded) as up:
        pool = Upstream(Timeouts())
        headers = CIMultiDict([("X-Tag", "one"), ("X-Tag", "two"), ("Content-Length", "999")])
        parts = [b"ab", memoryview(b"cd")]
        async with await pool.request("POST", url(up, "/a%2Fb?q=1"), headers, parts) as answer:
            assert await answer.read() == gzipped
            assert answer.headers.get("content-encoding") == "gzip"
        async with await pool.request("GET", url(up), {"Host": "peer.example"}, None) as answer:
            await answer.read()
    first, second = (head.split("\r\n") for head in up.heads)
    assert first[0] == "POST /a%2Fb?q=1 HTTP/1.1"
    assert sorted(first[1:-2]) == sorted(["X-Tag: one", "X-Tag: two", f"Host: {url(up).host}:{url(up).port}",
                                          "Content-Length: 4"])
    assert "Cookie" not in up.heads[1]
    assert second[0] == "GET /v1/x HTTP/1.1" and sorted(second[1:-2]) == ["Host: peer.example"]


async def test_a_header_value_with_a_line_break_is_refused_before_anything_is_sent() -> None:
    async with scripted(answer_each) as up:
        with pytest.raises(ValueError, match="line break"):
            await Upstream(Timeouts()).request("GET", url(up), {"X-Evil": "a\r\nX-Injected: 1"}, None)
        assert up.heads == []


async def test_a_head_answer_has_no_body_whatever_its_length_says() -> None:
    async def head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Scripted) -> None:
        while True:
            await up.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")

    async with scripted(head) as up:
        pool = Upstream(Timeouts())
        async with await pool.request("HEAD", url(up), {}, None) as answer:
            assert answer.headers["Content-Length"] == "5" and await answer.read() == b""
        async with await pool.request("HEAD", url(up), {}, None) as answer:
            assert await answer.read() == b""


def self_signed(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return cert, key


@contextlib.asynccontextmanager
async def tls_upstream(folder: Path) -> AsyncIterator[tuple[Scripted, Path]]:
    cert, key = self_signed(folder)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    upstream = Scripted(answer_each)
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0, ssl=context)
    upstream.url = f"https://localhost:{server.sockets[0].getsockname()[1]}"
    try:
        yield upstream, cert
    finally:
        server.close()


# Skipped without the openssl command, except in CI (LLMSWAP_REQUIRE_E2E=1, .ci/run installs it).
@pytest.mark.skipif(shutil.which("openssl") is None and os.environ.get("LLMSWAP_REQUIRE_E2E") != "1",
                    reason="needs the openssl command to make a certificate")
async def test_an_https_upstream_is_reached_over_tls_with_its_certificate_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with tls_upstream(tmp_path) as (up, cert):
        with pytest.raises(ConnectFailed, match="certificate"):  # the system's trust store knows it not
            await Upstream(Timeouts()).request("GET", url(up), {}, None)
        monkeypatch.setattr(http1, "_tls_context", lambda: ssl.create_default_context(cafile=str(cert)))
        pool = Upstream(Timeouts())
        for _ in range(2):
            async with await pool.request("GET", url(up), {}, None) as answer:
                assert await answer.read() == b"hello"
    assert up.heads[-1].split("\r\n")[1] == f"Host: localhost:{url(up).port}"
