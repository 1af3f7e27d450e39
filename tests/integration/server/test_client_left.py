"""A client that leaves: before its answer began it is recorded 499 (activity, access log, metrics), as
llama-swap now does; a stream it leaves keeps the status it was sent, and its activity row shows the tokens
that were sent before it left, and that the client left."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.wait import until
from tests.integration.server.conftest import ServeConfig, Served

MESSAGES = [{"role": "user", "content": "tell me about tokens"}]


async def rows(http: aiohttp.ClientSession, served: Served) -> list[dict[str, Any]]:
    async with http.get(served.at("/api/metrics/activity")) as response:
        return (await response.json())["data"]


async def test_a_stream_the_client_left_keeps_its_status_and_shows_the_tokens_sent(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--tokens-per-second", "20")))
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 200, "stream": True}
    async with aiohttp.ClientSession() as leaving:
        response = await leaving.post(served.at("/v1/chat/completions"), json=body)
        assert response.status == 200
        for _ in range(4):
            await response.content.readuntil(b"\n\n")
        response.close()  # the client hangs up mid-stream

    async def recorded() -> bool:
        return len(await rows(http, served)) == 1

    await until(recorded, what="the row of the stream the client left")
    [row] = await rows(http, served)
    assert row["resp_status_code"] == 200  # what the client was sent
    assert row["tokens"]["output_tokens"] >= 4  # the events sent before it left (it read four)
    assert row["error_msg"] == "the client went away during the answer"


async def test_a_client_that_leaves_while_queued_is_recorded_499(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--startup-delay", "5")))
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 2}
    async with aiohttp.ClientSession() as leaving:
        request = asyncio.ensure_future(leaving.post(served.at("/v1/chat/completions"), json=body))
        await until(lambda: served.router.snapshot().waiting.get("m", 0) == 1 or bool(
            served.services.inflight.entries()), what="the request waiting for its model")
        request.cancel()

    async def recorded() -> bool:
        return len(await rows(http, served)) == 1

    await until(recorded, what="the row of the request whose client left")
    [row] = await rows(http, served)
    assert row["resp_status_code"] == 499
    async with http.get(served.at("/metrics")) as response:
        assert 'status="499"' in await response.text()
