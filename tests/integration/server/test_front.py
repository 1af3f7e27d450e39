"""The front server over real sockets: what it serves itself answers as the aiohttp path does, everything
else on the same connection is handed to aiohttp and works, requests are answered in order, a client
that leaves or a cancel ends the request cleanly, and slow heads are still cut off."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from llmswap.config.model import ApiKey
from llmswap.server.connections import Runner
from llmswap.server.front import FrontSite
from tests.helpers.models import WITHIN, demo_config, exclusive_config
from tests.integration.server.conftest import HOST, ServeConfig, Served, until
from tests.integration.server.front_wire import RawClient, get, post

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
EMBED = {"model": "m", "input": ["one", "two"]}
SLOW_CHAT = {"model": "m", "messages": [{"role": "user", "content": "go"}], "max_tokens": 400}
KEY = "sk-front-0123456789"
BEARER = f"Authorization: Bearer {KEY}\r\n"


def port_of(served: Served) -> int:
    return int(served.url.rsplit(":", 1)[1])


@contextlib.asynccontextmanager
async def aiohttp_site(served: Served) -> AsyncIterator[int]:
    """aiohttp's own listener on the same runner (same app, same state): the path the front hands over to,
    taken for every request, to compare answers with."""
    site = web.TCPSite(served.runner, HOST, 0)
    await site.start()
    try:
        yield site.port
    finally:
        await site.stop()


def held_by_front(served: Served) -> int:
    runner = served.runner
    assert isinstance(runner, Runner)
    return len(runner.connection_server().front_held)


def held_by_aiohttp(served: Served) -> int:
    runner = served.runner
    assert isinstance(runner, Runner)
    return len(runner.connection_server().connections)


async def exchange(port: int, request: bytes) -> bytes:
    client = await RawClient.connect(port)
    try:
        await client.send(request)
        [answer] = await client.answers()
        return answer.without_date()
    finally:
        await client.close()


def idle(served: Served) -> bool:
    return served.router.snapshot().in_flight.get("m", 0) == 0


async def generating(http: aiohttp.ClientSession, served: Served) -> int:
    async with http.get(f"{served.config.models['m'].proxy}/props") as response:
        return int((await response.json())["demo"]["generations_in_progress"])


async def test_a_fast_answer_is_byte_identical_to_the_aiohttp_paths(serve_config: ServeConfig) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--echo")))
    async with aiohttp_site(served) as plain_port:
        # Headers the front reads from the head itself: padded, tabbed, empty, repeated, odd case.
        odd = "X-Request-Tag: same\r\nX-Padded:   a value  \t\r\nX-Empty:\r\nx-twice: 1\r\nX-Twice:2\r\n"
        request = post("/v1/embeddings", EMBED, extra=odd)
        fast = await exchange(port_of(served), request)
        plain = await exchange(plain_port, request)
    assert fast.startswith(b"HTTP/1.1 200 OK\r\n")
    assert fast == plain  # status line, every header but Date, and the body (which echoes what went up)
    assert b'"X-Padded": "a value"' in fast and b'"X-Empty": ""' in fast


async def test_refusals_are_answered_exactly_as_the_aiohttp_path_answers_them(
    serve_config: ServeConfig,
) -> None:
    config = exclusive_config(demo_config("m"), api_keys=(ApiKey(KEY),))
    served = await serve_config(config, loopback_listener=True)
    refused = [
        post("/v1/chat/completions", CHAT),  # no API key
        post("/v1/chat/completions", CHAT, extra="Authorization: Bearer wrong\r\n"),
        post("/v1/chat/completions", CHAT, host="evil.test", extra=BEARER),
        post("/v1/chat/completions", CHAT, extra=f"Origin: http://evil.test\r\n{BEARER}"),
        post("/v1/chat/completions", {**CHAT, "model": "nope"}, extra=BEARER),
    ]
    async with aiohttp_site(served) as plain_port:
        for request in refused:
            fast = await exchange(port_of(served), request)
            assert fast == await exchange(plain_port, request)
            assert fast.split(b" ")[1] in (b"401", b"403", b"404")
    assert not served.router.snapshot().in_flight


async def test_other_requests_on_a_fast_connection_are_handed_to_aiohttp(serve_config: ServeConfig) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    client = await RawClient.connect(port_of(served))
    try:
        await client.send(post("/v1/chat/completions", CHAT))
        [fast] = await client.answers()
        assert fast.status == 200 and fast.json()["object"] == "chat.completion"
        assert (held_by_front(served), held_by_aiohttp(served)) == (1, 0)  # served on the front
        await client.send(post("/v1/chat/completions", {**CHAT, "stream": True}))
        [stream] = await client.answers()
        assert stream.status == 200 and b"data: [DONE]" in stream.body
        assert (held_by_front(served), held_by_aiohttp(served)) == (0, 1)  # handed over, same connection
        await client.send(get("/v1/models") + get("/ui"))
        models, page = await client.answers(2)
        assert models.json()["data"][0]["id"] == "m"
        assert page.status == 200 and b"<" in page.body
        await client.send(get("/api/events"))
        head = await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), WITHIN)
        assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head
        assert b"data:" in await asyncio.wait_for(client.reader.readuntil(b"\n\n"), WITHIN)
    finally:
        await client.close()

    client = await RawClient.connect(port_of(served))
    try:
        await client.send(post("/v1/chat/completions", CHAT))
        [first] = await client.answers()
        assert first.status == 200
        await client.send(b"GET /upstream/m/ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
                          b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                          b"Sec-WebSocket-Version: 13\r\n\r\n")
        head = await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), WITHIN)
        assert head.startswith(b"HTTP/1.1 101"), head
        assert (held_by_front(served), held_by_aiohttp(served)) == (0, 1)
    finally:
        await client.close()


async def test_pipelined_requests_are_answered_in_order(serve_config: ServeConfig) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    client = await RawClient.connect(port_of(served))
    try:
        await client.send(post("/v1/embeddings", {**EMBED, "input": ["a"]})
                          + post("/v1/chat/completions", CHAT)
                          + post("/v1/embeddings", {**EMBED, "input": ["a", "b", "c"]})
                          + get("/health")
                          + post("/v1/embeddings", {**EMBED, "input": ["a", "b"]}))
        answers = await client.answers(5)
    finally:
        await client.close()
    assert [answer.status for answer in answers] == [200] * 5
    assert [len(answers[i].json()["data"]) for i in (0, 2, 4)] == [1, 3, 2]
    assert answers[1].json()["object"] == "chat.completion"
    assert answers[3].body.strip() == b"OK"


async def test_a_client_gone_mid_request_closes_the_upstream_call_and_frees_the_model(
    serve_config: ServeConfig, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--tokens-per-second", "20")))
    client = await RawClient.connect(port_of(served))
    await client.send(post("/v1/chat/completions", SLOW_CHAT))
    with caplog.at_level(logging.INFO, logger="llmswap.access"):
        await until(lambda: served.router.snapshot().in_flight.get("m", 0) == 1, what="the request in flight")

        async def upstream_generating() -> bool:
            return await generating(http, served) == 1

        await until(upstream_generating, what="the upstream to generate")
        await client.close()

        async def upstream_stopped() -> bool:
            return await generating(http, served) == 0

        await until(upstream_stopped, what="the upstream to see its request closed")
        await until(lambda: idle(served), what="the model's slot freed")
        await until(lambda: any('"POST /v1/chat/completions" client gone' in r.getMessage()
                                for r in caplog.records), what="the access log line")


async def test_a_cancel_through_api_inflight_ends_a_fast_request_cleanly(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--tokens-per-second", "20")))
    client = await RawClient.connect(port_of(served))
    try:
        await client.send(post("/v1/chat/completions", SLOW_CHAT))

        async def one_in_flight() -> bool:
            async with http.get(served.at("/api/inflight")) as response:
                return len((await response.json())["requests"]) == 1

        await until(one_in_flight, what="the request listed in flight")
        async with http.get(served.at("/api/inflight")) as response:
            [entry] = (await response.json())["requests"]
        async with http.post(served.at(f"/api/inflight/{entry['id']}/cancel")) as response:
            assert response.status == 200
        [answer] = await client.answers()
        assert answer.status == 502
        assert "cancelled" in answer.json()["error"]["message"]
        await until(lambda: idle(served), what="the model's slot freed")
        await client.send(post("/v1/chat/completions", CHAT))  # the connection stays usable
        [after] = await client.answers()
        assert after.status == 200
    finally:
        await client.close()


async def test_a_slow_head_is_cut_off_after_the_client_header_timeout(serve_config: ServeConfig) -> None:
    served = await serve_config(exclusive_config(demo_config("m"), client_header_timeout=0.3))
    client = await RawClient.connect(port_of(served))
    try:
        await client.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n")
        assert await client.closed_by_server()
    finally:
        await client.close()
    assert held_by_front(served) == 0


async def test_a_malformed_request_after_a_fast_one_gets_aiohttps_400_in_the_envelope(
    serve_config: ServeConfig,
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    client = await RawClient.connect(port_of(served))
    try:
        await client.send(post("/v1/embeddings", EMBED))
        [fast] = await client.answers()
        assert fast.status == 200
        await client.send(b"POST /v1/embeddings HTTP/1.1\r\nHost: localhost\r\nContent-Length: x\r\n\r\n")
        [refused] = await client.answers()
        assert await client.closed_by_server()
    finally:
        await client.close()
    assert refused.status == 400
    assert refused.json()["error"]["type"] == "invalid_request_error"


async def test_a_client_asking_to_close_gets_its_fast_answer_then_the_connection_closes(
    serve_config: ServeConfig,
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    client = await RawClient.connect(port_of(served))
    try:
        await client.send(post("/v1/embeddings", EMBED, extra="Connection: close\r\n"))
        [answer] = await client.answers()
        assert await client.closed_by_server()
    finally:
        await client.close()
    assert answer.status == 200 and answer.headers["connection"] == "close"
    assert len(answer.json()["data"]) == 2


async def test_a_large_fast_answer_to_a_slow_reader_waits_for_it_and_arrives_whole(
    serve_config: ServeConfig,
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    large = post("/v1/embeddings", {**EMBED, "input": [f"text {i}" for i in range(64)], "dimensions": 4096})
    async with aiohttp_site(served) as plain_port:
        expected = await exchange(plain_port, large)
    client = await RawClient.connect(port_of(served))
    try:
        await client.send(large)
        runner = served.runner
        assert isinstance(runner, Runner)

        def paused() -> bool:
            return any(getattr(held, "write_paused", False) for held in runner.connection_server().front_held)

        await until(paused, what="the front to stop writing to a client that does not read")
        [answer] = await client.answers()
    finally:
        await client.close()
    assert len(answer.body) > 1024 * 1024
    assert answer.without_date() == expected


async def test_a_client_gone_while_its_model_loads_leaves_the_queue(
    serve_config: ServeConfig, caplog: pytest.LogCaptureFixture
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--startup-delay", "30")))
    client = await RawClient.connect(port_of(served))
    await client.send(post("/v1/chat/completions", CHAT))
    with caplog.at_level(logging.INFO, logger="llmswap.access"):
        await until(lambda: served.router.snapshot().waiting.get("m", 0) == 1, what="the request queued")
        await client.close()
        await until(lambda: not served.router.snapshot().waiting.get("m", 0), what="the queue empty again")
        await until(lambda: any('"POST /v1/chat/completions" client gone' in r.getMessage()
                                for r in caplog.records), what="the access log line")
    assert not served.router.snapshot().in_flight.get("m", 0)


async def test_a_share_that_fails_leaves_the_connection_here_and_logs_why(
    serve_config: ServeConfig, caplog: pytest.LogCaptureFixture
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    [site] = [site for site in served.runner.sites if isinstance(site, FrontSite)]
    assert site.front is not None

    def broken() -> None:
        raise RuntimeError("no turn to give")

    site.front.share = broken
    with caplog.at_level(logging.ERROR, logger="llmswap.server"):
        async with aiohttp.ClientSession() as http, http.post(served.url + "/v1/chat/completions",
                                                              json=CHAT) as response:
            assert response.status == 200, await response.text()
    assert "choosing who serves a new connection failed" in caplog.text and "no turn to give" in caplog.text
