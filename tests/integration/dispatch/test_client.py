"""The upstream client (aiohttp's, as llmswap sets it up) on real loopback sockets: bodies relayed as they
arrive (chunked, sized, delimited by the close), back-pressure, keep-alive reuse and its bound, connections
the upstream closed (idle, or by restarting), abandoned answers closing their connection, the
response-header timeout, exactly the caller's headers going out, and errors in the client's own terms.

Most upstreams here are tiny asyncio servers scripted by the test (`tests.helpers.scripted_upstream`); the
restart test kills and restarts a real demo upstream on the same port; the https one serves a certificate
made for it with the openssl command.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from multidict import CIMultiDict
from yarl import URL

from llmswap.config.model import Timeouts
from llmswap.upstream import client
from llmswap.upstream.client import (
    MAX_IDLE,
    ConnectFailed,
    ConnectTimeout,
    Upstream,
    UpstreamClosed,
    UpstreamProtocolError,
    keepalive_seconds,
    send,
)
from tests.helpers.demo import running_demo
from tests.helpers.scripted_upstream import Scripted, answer_each, ok, scripted, url


async def test_a_sized_answer_is_read_and_its_connection_reused() -> None:
    async with scripted(answer_each) as up:
        pool = Upstream(Timeouts())
        for _ in range(2):
            async with await pool.request("POST", url(up), {"Content-Type": "application/json"},
                                          b"{}") as answer:
                assert (answer.status, answer.reason) == (200, "OK")
                assert answer.headers.get("content-length") == "5"
                assert await answer.read() == b"hello"
        assert up.connections == 1
        await pool.close()


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
        await pool.close()


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
        async with await pool.request("GET", url(up), {}, None) as answer:
            assert await answer.read() == b"part one, part two"
        assert up.connections == 2  # the first connection ended with its answer
        await pool.close()


async def test_an_answer_the_upstream_breaks_off_raises_after_the_bytes_that_came() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Scripted) -> None:
        await up.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")

    async with scripted(cut) as up:
        pool = Upstream(Timeouts())
        answer = await pool.request("GET", url(up), {}, None)
        assert await answer.read_chunk() == b"only this"
        with pytest.raises(UpstreamClosed):
            await answer.read_chunk()
        answer.close()
        await pool.close()


async def test_bytes_that_are_not_http_fail_the_request() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Scripted) -> None:
        await up.read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await up.wait_client_close(reader)

    async with scripted(garbage) as up:
        pool = Upstream(Timeouts())
        with pytest.raises(UpstreamProtocolError):
            await pool.request("GET", url(up), {}, None)
        await pool.close()


async def test_an_interim_answer_is_skipped() -> None:
    async def interim(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Scripted) -> None:
        await up.read_request(reader)
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n" + ok(b"final"))
        await up.wait_client_close(reader)

    async with scripted(interim) as up:
        pool = Upstream(Timeouts())
        async with await pool.request("GET", url(up), {}, None) as answer:
            assert answer.status == 200 and "Link" not in answer.headers
            assert await answer.read() == b"final"
        await pool.close()


async def test_a_slow_reader_pauses_the_upstream_and_still_gets_every_byte() -> None:
    total = 16 * 1024 * 1024
    block = b"x" * 65536
    sent = 0

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Scripted) -> None:
        nonlocal sent
        await up.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        for _ in range(total // len(block)):
            writer.write(block)
            await writer.drain()
            sent += len(block)

    async with scripted(flood) as up:
        pool = Upstream(Timeouts())
        answer = await pool.request("GET", url(up), {}, None)
        for _ in range(20):  # nobody reads: the upstream's writes stall well short of the whole body
            await asyncio.sleep(0.01)
        assert sent < total // 2
        received = 0
        while chunk := await answer.read_chunk():
            received += len(chunk)
        assert received == total
        answer.release()
        await pool.close()


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
        await asyncio.sleep(0.05)  # the close reaches the client
        async with await send(pool, "POST", url(up), {}, b"{}", 0) as answer:
            assert await answer.read() == b"hello"
        assert up.connections == 2
        await pool.close()


def test_idle_connections_are_kept_below_the_idle_close_of_the_servers_behind() -> None:
    assert keepalive_seconds(Timeouts()) == MAX_IDLE < 5  # idleConn is 90 s; llama-server closes at 5
    assert keepalive_seconds(Timeouts(idle_conn=0)) == MAX_IDLE  # 0: no limit of its own
    assert keepalive_seconds(Timeouts(idle_conn=0.5)) == 0.5


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
        await asyncio.wait_for(up.client_closed.wait(), 10)
        await pool.close()


async def test_a_pooled_connection_to_an_upstream_that_restarted_is_replaced() -> None:
    async with running_demo("r") as demo:
        port = demo.port
        pool = Upstream(Timeouts())
        target = URL(f"{demo.url}/v1/models")
        async with await send(pool, "GET", target, {}, None, 0) as answer:
            assert answer.status == 200 and b'"r"' in await answer.read()
        await demo.kill()
    async with running_demo("r", port=port) as demo:
        chat = b'{"model": "r", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
        async with await send(pool, "POST", URL(f"{demo.url}/v1/chat/completions"),
                              {"Content-Type": "application/json"}, chat, 0) as answer:
            assert answer.status == 200, await answer.read()
            assert b"chat.completion" in await answer.read()
    await pool.close()


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
        await pool.close()


async def test_no_headers_within_the_response_header_limit_is_a_timeout_that_closes_the_connection() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Scripted) -> None:
        await up.read_request(reader)
        await up.wait_client_close(reader)

    async with scripted(silent) as up:
        pool = Upstream(Timeouts())
        with pytest.raises(TimeoutError):
            await send(pool, "POST", url(up), {}, b"{}", 0.05)
        await asyncio.wait_for(up.client_closed.wait(), 10)
        await pool.close()


async def test_only_the_callers_headers_go_out_with_host_and_length_and_bytes_stay_encoded() -> None:
    gzipped = b"\x1f\x8b\x08\x00fake-gzip-bytes"

    async def encoded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Scripted) -> None:
        while True:
            await up.read_request(reader)
            writer.write(ok(gzipped, b"Content-Encoding: gzip\r\nSet-Cookie: a=1\r\n"))

    async with scripted(encoded) as up:
        pool = Upstream(Timeouts())
        headers = CIMultiDict([("X-Tag", "one"), ("X-Tag", "two"), ("Content-Length", "999")])
        async with await pool.request("POST", URL(up.url + "/a%2Fb?q=1", encoded=True), headers,
                                      b"abcd") as answer:
            assert await answer.read() == gzipped
            assert answer.headers.get("content-encoding") == "gzip"
        async with await pool.request("GET", url(up), {"Host": "peer.example"}, None) as answer:
            await answer.read()
        await pool.close()
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
        assert up.heads == [] and up.connections == 0


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
        await pool.close()


async def test_connecting_fails_in_the_clients_own_terms() -> None:
    async with scripted(answer_each) as up:
        port = url(up).port
    pool = Upstream(Timeouts())
    with pytest.raises(ConnectFailed, match=f"cannot connect to 127.0.0.1:{port}"):
        await pool.request("POST", URL(f"http://127.0.0.1:{port}/v1/x"), {}, b"{}")
    await pool.close()
    with pytest.raises(UpstreamClosed, match="closed"):
        await pool.request("GET", URL(f"http://127.0.0.1:{port}/v1/x"), {}, None)
    assert issubclass(ConnectTimeout, ConnectFailed) and issubclass(ConnectFailed, OSError)


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
        untrusting = Upstream(Timeouts())
        with pytest.raises(ConnectFailed, match="certificate"):  # the system's trust store knows it not
            await untrusting.request("GET", url(up), {}, None)
        await untrusting.close()
        monkeypatch.setattr(client, "tls_context", lambda: ssl.create_default_context(cafile=str(cert)))
        pool = Upstream(Timeouts())
        for _ in range(2):
            async with await pool.request("GET", url(up), {}, None) as answer:
                assert await answer.read() == b"hello"
        await pool.close()
    assert up.heads[-1].split("\r\n")[1] == f"Host: localhost:{url(up).port}"
