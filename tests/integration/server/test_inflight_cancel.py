"""`POST /api/inflight/{id}/cancel` over real HTTP: the cancelled client gets a clean end, the upstream call
is closed, the model's slot is free for the next request at once, and the cancel is recorded."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.sse import parse_events
from tests.helpers.wait import until
from tests.integration.server.conftest import ServeConfig, Served

MESSAGES = [{"role": "user", "content": "go"}]


async def inflight(http: aiohttp.ClientSession, served: Served) -> list[dict[str, Any]]:
    async with http.get(served.at("/api/inflight")) as response:
        assert response.status == 200
        return (await response.json())["requests"]


async def generating(http: aiohttp.ClientSession, served: Served) -> int:
    async with http.get(f"{served.config.models['m'].proxy}/props") as response:
        return int((await response.json())["demo"]["generations_in_progress"])


async def open_slow_stream(http: aiohttp.ClientSession, served: Served) -> aiohttp.ClientResponse:
    slow = {"model": "m", "messages": MESSAGES, "max_tokens": 1000, "stream": True}
    streaming = await http.post(served.at("/v1/chat/completions"), json=slow)
    assert streaming.status == 200
    await streaming.content.readline()  # the answer is under way
    return streaming


async def cancel(http: aiohttp.ClientSession, served: Served, entry_id: str) -> None:
    async with http.post(served.at(f"/api/inflight/{entry_id}/cancel")) as response:
        assert response.status == 200 and await response.json() == {"msg": "ok"}


def assert_clean_cancelled_end(rest: str) -> None:
    events = parse_events(rest)
    assert events[-1].data == "[DONE]"
    assert "cancelled" in events[-2].json()["error"]["message"]


async def test_cancelling_a_stream_ends_it_cleanly_closes_the_upstream_and_frees_the_slot(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--tokens-per-second", "5",
                                                             concurrency_limit=1)))
    streaming = await open_slow_stream(http, served)
    async with streaming:
        [entry] = await inflight(http, served)
        assert entry["req_path"] == "/v1/chat/completions" and entry["model"] == "m"
        await cancel(http, served, entry["id"])
        assert_clean_cancelled_end((await streaming.content.read()).decode())

    async def upstream_stopped() -> bool:
        return await generating(http, served) == 0

    await until(upstream_stopped, what="the demo to stop generating for the cancelled request")
    assert served.router.snapshot().in_flight.get("m", 0) == 0
    async with http.get(served.at("/api/metrics/activity")) as response:
        [row] = (await response.json())["data"]
    assert row["resp_status_code"] == 502 and "cancelled" in row["error_msg"]
    # concurrencyLimit: 1 would answer 429 if the cancelled request still counted.
    quick = {"model": "m", "messages": MESSAGES, "max_tokens": 2}
    async with http.post(served.at("/v1/chat/completions"), json=quick) as response:
        assert response.status == 200
    async with http.post(served.at(f"/api/inflight/{entry['id']}/cancel")) as response:
        assert response.status == 404
        assert (await response.json())["error"]["message"] == "inflight request not found"


async def test_a_request_queued_behind_a_cancelled_stream_is_served_right_after(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    slow_model = demo_config("m", "--tokens-per-second", "5", concurrency_limit=1)
    served = await serve_config(exclusive_config(slow_model, demo_config("b")))
    streaming = await open_slow_stream(http, served)
    async with streaming:
        async def second() -> tuple[int, dict[str, Any]]:
            body = {"model": "b", "messages": MESSAGES, "max_tokens": 2}
            async with http.post(served.at("/v1/chat/completions"), json=body) as response:
                return response.status, await response.json()

        queued = asyncio.create_task(second())
        # b cannot load while m (one model at a time) is busy with the slow stream.
        await until(lambda: served.router.snapshot().waiting.get("b", 0) == 1, what="b's request queued")
        first = next(entry for entry in await inflight(http, served) if entry["model"] == "m")
        assert not queued.done()
        await cancel(http, served, first["id"])
        assert_clean_cancelled_end((await streaming.content.read()).decode())
    status, answer = await asyncio.wait_for(queued, 15)
    assert status == 200 and answer["usage"]["completion_tokens"] == 2
    assert served.router.snapshot().in_flight.get("m", 0) == 0


async def test_cancelling_a_request_before_any_answer_gives_an_error_body_and_a_row(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--startup-delay", "30")))

    async def waiting() -> tuple[int, dict[str, Any]]:
        body = {"model": "m", "messages": MESSAGES}
        async with http.post(served.at("/v1/chat/completions"), json=body) as response:
            return response.status, await response.json()

    request = asyncio.create_task(waiting())

    async def tracked() -> bool:
        return len(await inflight(http, served)) == 1

    await until(tracked, what="the request in flight")
    [entry] = await inflight(http, served)
    async with http.post(served.at(f"/api/inflight/{entry['id']}/cancel")) as response:
        assert response.status == 200
    status, body = await asyncio.wait_for(request, 15)
    assert status == 502 and "cancelled" in body["error"]["message"]
    async with http.get(served.at("/api/metrics/activity")) as response:
        [row] = (await response.json())["data"]
    assert row["resp_status_code"] == 502 and "cancelled" in row["error_msg"]
    assert served.router.snapshot().in_flight.get("m", 0) == 0
