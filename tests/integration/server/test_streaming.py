"""Streaming passthrough: unbuffered relay, upstream death, client disconnects, connection reuse."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

import aiohttp
import psutil

from llmswap.process.state import ProcessState
from llmswap.router import SwapStarted
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.sse import parse_events
from tests.helpers.wait import until
from tests.integration.server.conftest import ServeConfig, Served

LONG = 10_000  # tokens: at the paces below, far longer than any test waits


def chat(model: str, *, stream: bool = True, max_tokens: int = LONG) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
            "stream": stream}


async def demo_props(http: aiohttp.ClientSession, served: Served, model: str) -> dict[str, Any]:
    """The upstream's own counters, asked directly (not through llmswap)."""
    async with http.get(served.router.processes[model].config.proxy + "/props") as response:
        props = await response.json()
        return dict(props["demo"])


async def first_content(response: aiohttp.ClientResponse) -> str:
    """Read events until one carries generated text."""
    while True:
        line = await response.content.readline()
        assert line, "the stream ended before any content"
        if line.startswith(b"data: {"):
            delta = json.loads(line[6:])["choices"][0]["delta"]
            if delta.get("content"):
                return str(delta["content"])


async def test_chunks_reach_the_client_while_the_upstream_still_generates(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--tokens-per-second", "10")))
    async with http.post(served.at("/v1/chat/completions"), json=chat("m")) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["X-Accel-Buffering"] == "no"
        assert response.headers["X-Demo-Model"] == "m"  # upstream headers pass through
        assert await first_content(response) == "demo"
        props = await demo_props(http, served, "m")
        # The first token arrived while the upstream had produced only part of the answer.
        assert props["generations_in_progress"] == 1
        assert props["tokens_generated"] < LONG


async def test_client_leaving_mid_stream_stops_the_upstream_generation(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--tokens-per-second", "20")))
    async with http.post(served.at("/v1/chat/completions"), json=chat("m")) as response:
        await first_content(response)
        assert (await demo_props(http, served, "m"))["generations_in_progress"] == 1
        response.close()  # hang up without reading on

    async def generation_stopped() -> bool:
        return (await demo_props(http, served, "m"))["generations_in_progress"] == 0

    await until(generation_stopped, what="the upstream to stop generating")
    await until(lambda: served.router.snapshot().in_flight.get("m", 0) == 0, what="the request to end")
    assert served.router.processes["m"].state is ProcessState.READY


async def test_upstream_dying_mid_stream_ends_the_stream_with_an_error_event(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--tokens-per-second", "20")))
    async with http.post(served.at("/v1/chat/completions"), json=chat("m")) as response:
        await first_content(response)
        pid = served.router.processes["m"].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        events = parse_events((await response.read()).decode())
    error = events[-2].json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "bad_gateway")
    assert "broke off its answer" in error["message"]
    assert events[-1].data == "[DONE]"
    await until(lambda: served.router.processes["m"].state is ProcessState.STOPPED, what="m marked stopped")
    # The next request starts it again.
    short = chat("m", stream=False, max_tokens=2)
    async with http.post(served.at("/v1/chat/completions"), json=short) as again:
        assert again.status == 200


async def test_upstream_dying_before_its_answer_is_502(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--tokens-per-second", "20")))
    request = asyncio.create_task(http.post(served.at("/v1/chat/completions"), json=chat("m", stream=False)))
    await until(lambda: served.router.snapshot().in_flight.get("m", 0) == 1, what="the request to be served")

    async def generating() -> bool:
        return (await demo_props(http, served, "m"))["generations_in_progress"] == 1

    await until(generating, what="the upstream to start generating")
    pid = served.router.processes["m"].pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    async with await request as response:
        assert response.status == 502
        error = (await response.json())["error"]
    assert error["message"].startswith("upstream proxy error: ")


async def test_non_event_stream_bodies_are_relayed_byte_for_byte(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    body = {"model": "m", "input": "x" * 60}
    async with http.post(served.at("/v1/audio/speech"), json=body) as response:
        assert response.status == 200
        through_llmswap = await response.read()
        content_type = response.headers["Content-Type"]
    async with http.post(served.router.processes["m"].config.proxy + "/v1/audio/speech", json=body) as direct:
        assert through_llmswap == await direct.read()
        assert content_type == direct.headers["Content-Type"] == "audio/wav"


async def test_client_leaving_while_queued_never_starts_its_model(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    slow = demo_config("a", "--tokens-per-second", "20")
    served = await serve_config(exclusive_config(slow, demo_config("b")))
    swaps: list[str] = []

    def record(item: object) -> None:
        if isinstance(item, SwapStarted):
            swaps.append(item.plan.model)

    served.router.add_observer(record)
    async with http.post(served.at("/v1/chat/completions"), json=chat("a")) as holding:
        await first_content(holding)
        other = chat("b", stream=False)
        waiting = asyncio.create_task(http.post(served.at("/v1/chat/completions"), json=other))
        await until(lambda: served.router.snapshot().waiting.get("b", 0) == 1, what="b queued behind a")
        waiting.cancel()  # the client hangs up while queued
        await asyncio.gather(waiting, return_exceptions=True)
        await until(lambda: served.router.snapshot().waiting.get("b", 0) == 0, what="b leaving the queue")
        holding.close()
    await until(lambda: served.router.snapshot().in_flight.get("a", 0) == 0, what="a's request to end")
    await served.router.wait_idle()
    assert swaps == ["a"]
    assert served.router.processes["b"].state is ProcessState.STOPPED
    assert served.router.processes["a"].state is ProcessState.READY


async def test_requests_to_one_upstream_reuse_a_kept_alive_connection(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    for _ in range(5):
        async with http.post(served.at("/v1/embeddings"), json={"model": "m", "input": "hi"}) as response:
            assert response.status == 200
            await response.read()
    process = served.router.processes["m"]
    assert process.pid is not None and process.config.port is not None
    upstream = psutil.Process(process.pid)
    accepted = [
        conn for conn in upstream.net_connections(kind="tcp")
        if conn.status == psutil.CONN_ESTABLISHED and conn.laddr.port == process.config.port
    ]
    assert len(accepted) == 1, accepted

