"""Activity over real HTTP with demo upstreams: every request becomes a row whose tokens and speeds are what
the upstream reported (whole answers and streams), captures round-trip redacted, the `activity` event, the
query API's shapes and errors."""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmswap.config.model import ActivityConfig, ApiKey, TasksConfig, TaskTypeConfig
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.sse import parse_events
from tests.helpers.wait import until
from tests.integration.server.conftest import ServeConfig, Served
from tests.integration.server.test_events import events
from tests.integration.server.test_metrics import get, scrape

MESSAGES = [{"role": "user", "content": "tell me about tokens"}]


async def rows(http: aiohttp.ClientSession, served: Served, query: str = "") -> list[dict[str, Any]]:
    async with http.get(served.at(f"/api/metrics/activity{query}")) as response:
        assert response.status == 200, await response.text()
        return (await response.json())["data"]


async def row_for(http: aiohttp.ClientSession, served: Served, count: int) -> list[dict[str, Any]]:
    async def enough() -> bool:
        return len(await rows(http, served)) >= count

    await until(enough, what=f"{count} activity rows")
    return await rows(http, served)


def assert_tokens_match_timings(row: dict[str, Any], timings: dict[str, Any]) -> None:
    tokens = row["tokens"]
    assert tokens["input_tokens"] == timings["prompt_n"]
    assert tokens["output_tokens"] == timings["predicted_n"]
    assert tokens["cache_tokens"] == timings["cache_n"]
    assert tokens["prompt_per_second"] == pytest.approx(timings["prompt_per_second"])
    assert tokens["tokens_per_second"] == pytest.approx(timings["predicted_per_second"])


async def test_whole_answer_is_recorded_with_the_upstreams_tokens_and_a_redacted_capture(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    model = demo_config("m", "--tokens-per-second", "200", aliases=("alias",))
    served = await serve_config(exclusive_config(model, aliases={"alias": "m"}))
    body = {"model": "alias", "messages": MESSAGES, "max_tokens": 5}
    headers = {"Authorization": "Bearer secret-token", "Cookie": "session=abc"}
    async with events(http, served) as stream:
        async with http.post(served.at("/v1/chat/completions"), json=body, headers=headers) as response:
            assert response.status == 200
            answer = await response.json()
        announced = await stream.until("activity")
    [row] = await rows(http, served)
    assert announced == {"id": row["id"]}
    assert (row["model"], row["requested_model"], row["req_path"], row["resp_status_code"]) == (
        "m", "alias", "/v1/chat/completions", 200)
    assert_tokens_match_timings(row, answer["timings"])
    assert row["load_ms"] is not None and row["queue_ms"] is not None and row["ttfb_ms"] is not None
    assert row["duration_ms"] >= row["ttfb_ms"] and row["has_capture"] is True

    async with http.get(served.at(f"/api/captures/{row['id']}")) as response:
        capture = await response.json()
    assert capture["id"] == row["id"] and capture["req_path"] == "/v1/chat/completions"
    assert json.loads(base64.b64decode(capture["req_body"])) == body
    assert json.loads(base64.b64decode(capture["resp_body"])) == answer
    assert capture["req_headers"]["Authorization"] == capture["req_headers"]["Cookie"] == "[REDACTED]"
    assert "secret-token" not in json.dumps(capture)


async def test_streamed_answer_is_recorded_from_its_last_events(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--tokens-per-second", "200")))
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 6, "stream": True,
            "stream_options": {"include_usage": True}}
    async with http.post(served.at("/v1/chat/completions"), json=body) as response:
        text = await response.text()
    chunks = [event.json() for event in parse_events(text) if event.data != "[DONE]"]
    timings = next(chunk["timings"] for chunk in chunks if "timings" in chunk)
    usage = chunks[-1]["usage"]
    [row] = await row_for(http, served, 1)
    assert_tokens_match_timings(row, timings)
    assert row["tokens"]["input_tokens"] == usage["prompt_tokens"]
    assert row["resp_content_type"].startswith("text/event-stream")


async def test_anthropic_stream_counts_come_from_message_start_and_message_delta(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 4, "stream": True}
    async with http.post(served.at("/v1/messages"), json=body) as response:
        events_seen = [event.json() for event in parse_events(await response.text())]
    start = next(e for e in events_seen if e["type"] == "message_start")["message"]["usage"]
    delta = next(e for e in events_seen if e["type"] == "message_delta")["usage"]
    [row] = await row_for(http, served, 1)
    assert (row["tokens"]["input_tokens"], row["tokens"]["output_tokens"]) == (
        start["input_tokens"], delta["output_tokens"])
    assert row["tokens"]["tokens_per_second"] == -1  # Anthropic's usage carries no speeds


async def test_failed_requests_are_recorded_with_their_message_and_key_name(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    keys = (ApiKey("first-key"), ApiKey("second-key"))
    served = await serve_config(exclusive_config(demo_config("m"), api_keys=keys))
    auth = {"Authorization": "Bearer second-key"}
    async with http.post(served.at("/v1/chat/completions"), json={"model": "m", "messages": "nope"},
                         headers=auth) as response:
        assert response.status == 400
        message = (await response.json())["error"]["message"]
    [row] = await row_for_auth(http, served, auth)
    assert (row["resp_status_code"], row["error_msg"], row["key_name"]) == (400, message, "apiKeys[1]")
    assert "second-key" not in json.dumps(row)
    async with http.get(served.at(f"/api/captures/{row['id']}"), headers=auth) as response:
        capture = await response.json()
    # llmswap's own keys never go upstream, so the capture (what was sent) has none.
    assert "Authorization" not in capture["req_headers"] and "second-key" not in json.dumps(capture)
    assert json.loads(base64.b64decode(capture["resp_body"]))["error"]["message"] == message


async def row_for_auth(http: aiohttp.ClientSession, served: Served, auth: dict[str, str]) -> list[Any]:
    async with http.get(served.at("/api/metrics/activity"), headers=auth) as response:
        return (await response.json())["data"]


async def test_captures_off_and_bad_ids(serve_config: ServeConfig, http: aiohttp.ClientSession) -> None:
    config = dataclasses.replace(exclusive_config(demo_config("m")), activity=ActivityConfig(capture_mb=0))
    served = await serve_config(config)
    async with http.post(served.at("/v1/chat/completions"), json={"model": "m", "messages": MESSAGES}):
        pass
    [row] = await row_for(http, served, 1)
    assert row["has_capture"] is False
    async with http.get(served.at(f"/api/captures/{row['id']}")) as response:
        assert response.status == 404
        assert (await response.json())["error"]["message"] == "capture not found"
    async with http.get(served.at("/api/captures/abc")) as response:
        assert response.status == 400
        assert (await response.json())["error"]["message"] == "invalid capture ID"
    async with http.get(served.at("/api/metrics/activity?limit=1000")) as response:
        assert response.status == 400
        assert (await response.json())["error"]["message"] == "limit must be between 1 and 999"


async def test_stats_and_paging_follow_llama_swaps_shapes(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--tokens-per-second", "500"),
                                                 activity=ActivityConfig(max_in_memory=2)))
    for _ in range(3):
        body = {"model": "m", "prompt": "x", "max_tokens": 2}
        async with http.post(served.at("/v1/completions"), json=body):
            pass
    kept = served.services.recorder.log.rows  # rows are kept in batches: the third comes soon after
    await until(lambda: bool(kept) and kept[-1].id == 3, what="3 rows")
    async with http.get(served.at("/api/metrics/activity?limit=1")) as response:
        page = await response.json()
    assert (page["total"], page["limit"], page["page"], page["total_pages"]) == (2, 1, 1, 2)
    assert [r["id"] for r in page["data"]] == [3]
    async with http.get(served.at("/api/metrics/stats?model=m")) as response:
        stats = await response.json()
    assert stats["total_requests"] == 2 and stats["total_output_tokens"] == 4
    assert stats["gen_histogram"] is not None and stats["gen_histogram"]["p50"] > 0


async def test_a_task_is_recorded_with_the_tokens_of_its_answer(
    tmp_path: Path, serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    tasks = TasksConfig(db=tmp_path / "tasks.sqlite", types={"letters": TaskTypeConfig("letters", "m")})
    served = await serve_config(exclusive_config(demo_config("m"), tasks=tasks))
    body = {"type": "letters", "params": {"messages": MESSAGES, "max_tokens": 3}}
    async with http.post(served.at("/api/tasks"), json=body) as response:
        task_id = (await response.json())["id"]

    async def finished() -> bool:
        async with http.get(served.at(f"/api/tasks/{task_id}")) as response:
            return (await response.json())["status"] == "completed"

    await until(finished, what="the task completing")
    async with http.get(served.at(f"/api/tasks/{task_id}")) as response:
        answer = (await response.json())["result"]
    [row] = await row_for(http, served, 1)
    assert (row["origin"], row["model"], row["req_path"], row["resp_status_code"]) == (
        "task", "m", "/v1/chat/completions", 200)
    assert_tokens_match_timings(row, answer["timings"])
    assert row["queue_ms"] is not None


async def test_tokens_and_speeds_reach_metrics(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--tokens-per-second", "200")))
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 5}
    async with http.post(served.at("/v1/chat/completions"), json=body) as response:
        timings = (await response.json())["timings"]
    await row_for(http, served, 1)
    samples = await scrape(http, served)
    assert get(samples, "llmswap_tokens_total", model="m", kind="output") == 5
    assert get(samples, "llmswap_tokens_total", model="m", kind="input") == timings["prompt_n"]
    assert get(samples, "llmswap_generation_tokens_per_second_count", model="m") == 1
    assert get(samples, "llmswap_generation_tokens_per_second_sum", model="m") == pytest.approx(
        timings["predicted_per_second"])


async def test_upstream_model_routes_are_recorded_by_their_path_and_others_are_not(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 2}
    async with http.post(served.at("/upstream/m/v1/chat/completions"), json=body) as response:
        answer = await response.json()
    async with http.get(served.at("/upstream/m/props")) as response:
        assert response.status == 200
    [row] = await row_for(http, served, 1)
    assert (row["model"], row["req_path"], row["tokens"]["output_tokens"]) == (
        "m", "/v1/chat/completions", answer["usage"]["completion_tokens"])
