"""Loading feedback (`sendLoadingState`): progress while a streaming request waits for its model."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from llmswap.server.inference import loading
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.sse import Event, parse_events
from tests.helpers.wait import until
from tests.integration.server.conftest import ServeConfig
from tests.integration.server.test_events import events

MESSAGES = [{"role": "user", "content": "hi"}]


def commentary(events: list[Event], field: str = "reasoning_content") -> str:
    text = ""
    for event in events:
        if event.data == "[DONE]":
            continue
        choices = event.json().get("choices") or [{}]
        source = choices[0].get("delta", choices[0])
        text += source.get(field) or ""
    return text


def split_at_done(events: list[Event]) -> tuple[list[Event], list[Event]]:
    """(the loading commentary's events, the upstream's events)."""
    for index, event in enumerate(events):
        if event.data != "[DONE]" and event.json().get("id") != "llmswap-loading":
            return events[:index], events[index:]
    return events, []


async def test_streaming_chat_gets_progress_while_its_model_loads(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    model = demo_config("m", "--startup-delay", "1", send_loading_state=True, aliases=("fast",))
    served = await serve_config(exclusive_config(model, aliases={"fast": "m"}))
    body = {"model": "fast", "messages": MESSAGES, "max_tokens": 3, "stream": True}
    async with http.post(served.at("/v1/chat/completions"), json=body) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["X-Accel-Buffering"] == "no"
        events = parse_events((await response.read()).decode())
    loading, answer = split_at_done(events)
    text = commentary(loading)
    assert text.startswith("━━━━━\nllmswap loading model: m\n")
    assert "Done! (" in text and text.endswith("s)\n━━━━━\n \n")
    assert all(event.json()["model"] == "fast" for event in loading)
    assert "".join(e.json()["choices"][0]["delta"].get("content", "") for e in answer[:-1]) == "demo m says:"
    assert answer[-1].data == "[DONE]"


async def test_no_progress_when_the_model_is_ready_or_the_request_does_not_stream(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", send_loading_state=True)))
    async with http.post(served.at("/v1/chat/completions"),
                         json={"model": "m", "messages": MESSAGES, "max_tokens": 2}) as response:
        assert response.headers["Content-Type"].startswith("application/json")
        assert (await response.json())["object"] == "chat.completion"
    streaming = {"model": "m", "messages": MESSAGES, "max_tokens": 2, "stream": True}
    async with http.post(served.at("/v1/chat/completions"), json=streaming) as response:
        events = parse_events((await response.read()).decode())
    assert events[0].json()["id"] != "llmswap-loading"
    assert response.headers["X-Demo-Model"] == "m"  # the upstream's own headers: no loading stream began


async def test_no_progress_unless_the_model_asks_for_it(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--startup-delay", "0.3")))
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 2, "stream": True}
    async with http.post(served.at("/v1/chat/completions"), json=body) as response:
        events = parse_events((await response.read()).decode())
    assert response.headers["X-Demo-Model"] == "m"
    assert all(event.data == "[DONE]" or event.json()["id"] != "llmswap-loading" for event in events)


async def test_completions_progress_keeps_the_generated_text_clean(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    model = demo_config("m", "--startup-delay", "0.5", send_loading_state=True)
    served = await serve_config(exclusive_config(model))
    body = {"model": "m", "prompt": "hi", "max_tokens": 3, "stream": True}
    async with http.post(served.at("/v1/completions"), json=body) as response:
        assert response.status == 200
        events = parse_events((await response.read()).decode())
    loading, answer = split_at_done(events)
    assert commentary(loading).startswith("━━━━━\nllmswap loading model: m\n")
    assert all(event.json()["choices"][0]["text"] == "" for event in loading)
    assert "".join(event.json()["choices"][0]["text"] for event in answer[:-1]) == "demo m says:"


async def test_queued_request_is_told_its_position(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    busy = demo_config("a", "--tokens-per-second", "20")
    waiting = demo_config("b", send_loading_state=True)
    served = await serve_config(exclusive_config(busy, waiting))
    hold = {"model": "a", "messages": MESSAGES, "max_tokens": 10_000, "stream": True}
    body = {"model": "b", "messages": MESSAGES, "max_tokens": 2, "stream": True}
    async with http.post(served.at("/v1/chat/completions"), json=hold) as holding:
        await holding.content.readline()
        async with http.post(served.at("/v1/chat/completions"), json=body) as response:
            assert response.status == 200
            seen = ""
            while "Queue position: #1" not in seen:
                line = await response.content.readline()
                assert line, f"the stream ended before the queue position: {seen!r}"
                if line.startswith(b"data: {"):
                    seen += json.loads(line[6:])["choices"][0]["delta"].get("reasoning_content", "")
            holding.close()  # free the slot: b loads and answers
            events = parse_events((await response.read()).decode())
    rest = commentary(split_at_done(events)[0])
    assert "Done! (" in rest
    assert seen.startswith("━━━━━\nllmswap loading model: b\n")


async def test_a_failed_load_ends_the_progress_stream_with_an_error_event(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    model = demo_config("m", "--never-healthy", health_check_timeout=1.0, send_loading_state=True)
    served = await serve_config(exclusive_config(model))
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 2, "stream": True}
    async with http.post(served.at("/v1/chat/completions"), json=body) as response:
        assert response.status == 200  # the stream began before the load failed
        events = parse_events((await response.read()).decode())
    assert commentary(events[:-2]).startswith("━━━━━\nllmswap loading model: m\n")
    error = events[-2].json()["error"]
    assert "health check timed out after 1s" in error["message"]
    assert error["type"] == "server_error"
    assert events[-1].data == "[DONE]"
    await until(lambda: served.router.snapshot().in_flight.get("m", 0) == 0, what="the request to end")


async def test_a_429_is_decided_before_any_progress_stream(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    model = demo_config("m", "--startup-delay", "1", concurrency_limit=1, send_loading_state=True)
    served = await serve_config(exclusive_config(model))
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 2, "stream": True}
    async with http.post(served.at("/v1/chat/completions"), json=body) as first:
        assert first.status == 200
        await first.content.readline()  # the first is loading, holding the only slot
        async with http.post(served.at("/v1/chat/completions"), json=body) as second:
            assert second.status == 429
            assert (await second.json())["error"]["code"] == "concurrency_limit"
        await first.read()


async def test_openai_sdk_reads_a_stream_that_began_with_progress(serve_config: ServeConfig) -> None:
    model = demo_config("m", "--startup-delay", "0.5", send_loading_state=True)
    served = await serve_config(exclusive_config(model))
    client = openai.AsyncOpenAI(base_url=served.at("/v1"), api_key="unused", max_retries=0)
    try:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
        )
        content, reasoning = "", ""
        async for chunk in stream:
            delta: Any = chunk.choices[0].delta
            content += delta.content or ""
            reasoning += getattr(delta, "reasoning_content", None) or ""
    finally:
        await client.close()
    assert content == "demo m says:"
    assert "llmswap loading model: m" in reasoning


async def test_anthropic_stream_gets_pings_and_the_sdk_reads_it(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    model = demo_config("m", "--startup-delay", "1", send_loading_state=True)
    served = await serve_config(exclusive_config(model))
    body = {"model": "m", "max_tokens": 3, "messages": MESSAGES, "stream": True}
    async with http.post(served.at("/v1/messages"), json=body) as response:
        assert response.status == 200
        raw = (await response.read()).decode()
    assert ": llmswap loading model: m\n" in raw  # the commentary travels as SSE comments
    events = parse_events(raw)
    names = [event.name for event in events]
    assert names[0] == "ping"  # one per tick while loading, nothing Anthropic clients would misread
    first_real = names.index("message_start")
    assert set(names[:first_real]) == {"ping"}
    assert names[-1] == "message_stop"
    await served.router.unload()

    client = anthropic.AsyncAnthropic(base_url=served.url, api_key="unused", max_retries=0)
    try:
        messages: Any = MESSAGES
        async with client.messages.stream(model="m", max_tokens=3, messages=messages) as stream:
            text = await stream.get_final_text()
    finally:
        await client.close()
    assert text == "demo m says:"


async def test_anthropic_progress_stream_reports_a_failed_load_as_an_error_event(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    model = demo_config("m", "--exit-after", "0", send_loading_state=True)
    served = await serve_config(exclusive_config(model))
    body = {"model": "m", "max_tokens": 3, "messages": MESSAGES, "stream": True}
    async with asyncio.timeout(15), http.post(served.at("/v1/messages"), json=body) as response:
        assert response.status == 200
        events = parse_events((await response.read()).decode())
    assert events[-1].name == "error"
    error = events[-1].json()
    assert error["type"] == "error" and error["error"]["type"] == "api_error"
    assert "exited prematurely" in error["error"]["message"]


async def test_a_second_load_shows_a_progress_estimate_from_the_measured_load_time(
    serve_config: ServeConfig, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(loading, "PROGRESS_EVERY", 1)  # an estimate at every tick after the first remark
    model = demo_config("m", "--startup-delay", "3", send_loading_state=True)  # ticks at 0.75 s: room
    served = await serve_config(exclusive_config(model))
    async with http.post(served.at("/api/models/load/m")) as response:  # the first load is measured
        assert response.status == 200
    async with http.post(served.at("/api/models/unload/m")) as response:
        assert response.status == 200
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 3, "stream": True}
    chat = served.at("/v1/chat/completions")
    async with events(http, served) as feed, http.post(chat, json=body) as response:
        seen = await feed.until("loading", model="m")
        streamed = parse_events((await response.read()).decode())
    text = commentary(split_at_done(streamed)[0])
    assert re.search(r" ~\d+% \(loads take ~\d\.\ds\) ", text), text
    assert seen["expected_seconds"] >= 1.5 and 0 <= seen["progress"] < 1
    assert seen["elapsed_seconds"] < seen["expected_seconds"] * 2
