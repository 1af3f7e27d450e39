"""The watchdog over real demo upstreams: a stuck answer is cut with a clean error and its slot is freed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import aiohttp

from llmswap.config.model import TasksConfig, TaskTypeConfig, Timeouts
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.wait import until
from tests.integration.server.conftest import ServeConfig


def chat(max_tokens: int, *, stream: bool) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
            "stream": stream}


async def events(response: aiohttp.ClientResponse) -> list[str]:
    lines = [line.decode().strip() async for line in response.content]
    return [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]


async def test_an_answer_past_the_wall_timeout_is_cut_and_the_next_request_is_served(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    # Two tokens a second, one request at a time: a 1000-token answer would hold the model for minutes.
    model = demo_config("m", "--tokens-per-second", "2", concurrency_limit=1, timeouts=Timeouts(wall=1.5))
    served = await serve_config(exclusive_config(model))
    async with http.post(served.at("/v1/chat/completions"), json=chat(1000, stream=True)) as response:
        assert response.status == 200
        data = await events(response)
    error = json.loads(data[-2])["error"]
    assert data[-1] == "[DONE]"
    assert "took longer than 1.5s (models.m.timeouts.wall)" in error["message"]
    assert error["type"] == "server_error"

    # Its slot is free again (concurrencyLimit 1 would answer 429 otherwise), and a short answer fits.
    async with http.post(served.at("/v1/chat/completions"), json=chat(1, stream=False)) as response:
        assert response.status == 200, await response.text()


async def test_an_upstream_silent_past_the_idle_timeout_is_cut_with_an_error_event(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    model = demo_config("m", "--tokens-per-second", "0.2", timeouts=Timeouts(idle=0.5))  # 5 s between tokens
    served = await serve_config(exclusive_config(model))
    async with http.post(served.at("/v1/chat/completions"), json=chat(50, stream=True)) as response:
        data = await events(response)
    assert "sent nothing for 0.5s (models.m.timeouts.idle)" in data[-2]
    await until(lambda: served.router.snapshot().in_flight == {}, what="the cut request's slot freed")


async def test_a_non_streaming_answer_past_the_idle_timeout_is_504(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    model = demo_config("m", "--tokens-per-second", "0.2", timeouts=Timeouts(idle=0.5))
    served = await serve_config(exclusive_config(model))
    async with http.post(served.at("/v1/chat/completions"), json=chat(50, stream=False)) as response:
        assert response.status == 504
        assert "models.m.timeouts.idle" in (await response.json())["error"]["message"]


async def test_upstream_paths_of_a_model_are_bounded_by_its_timeouts_too(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    """`/upstream/<model>/...` goes to the model as the inference routes do: its watchdog applies."""
    model = demo_config("m", "--tokens-per-second", "0.2", timeouts=Timeouts(idle=0.5))
    served = await serve_config(exclusive_config(model))
    path = "/upstream/m/v1/chat/completions"
    async with http.post(served.at(path), json=chat(50, stream=False)) as response:
        assert response.status == 504
        assert "models.m.timeouts.idle" in (await response.json())["error"]["message"]


async def test_a_task_past_its_models_idle_timeout_fails_saying_so(
    tmp_path: Path, serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    """A task's request is bounded by its model's timeouts, as an HTTP request is: it fails, it does not
    hold the model for as long as the upstream stays silent."""
    model = demo_config("m", "--tokens-per-second", "0.2", timeouts=Timeouts(idle=0.5))
    tasks = TasksConfig(db=tmp_path / "tasks.sqlite", types={"slow": TaskTypeConfig("slow", "m")})
    served = await serve_config(dataclasses.replace(exclusive_config(model), tasks=tasks))
    body = {"type": "slow", "params": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}}
    async with http.post(served.at("/api/tasks"), json=body) as response:
        assert response.status == 201, await response.text()
        task_id = (await response.json())["id"]

    async def failed() -> bool:
        async with http.get(served.at(f"/api/tasks/{task_id}")) as response:
            return (await response.json())["status"] == "failed"

    await until(failed, what="the task failing on the idle timeout")
    async with http.get(served.at(f"/api/tasks/{task_id}")) as response:
        row = await response.json()
    assert "models.m.timeouts.idle" in row["error"], row
