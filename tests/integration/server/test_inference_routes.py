"""Every inference route reaches the right upstream path with the right body, through real HTTP.

One `--echo` demo per test: its answers carry exactly what it received (method, path, query, headers, body).
"""

from __future__ import annotations

import asyncio
import json
import os
from types import MappingProxyType
from typing import Any

import aiohttp
import pytest

from llmswap.config.model import ApiKey, Filters
from llmswap.router import SwapStarted
from llmswap.server.inference.routes import ROUTES
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.wait import until
from tests.integration.server.conftest import ServeConfig


def echo_of(payload: dict[str, Any]) -> dict[str, Any]:
    echo = payload.get("echo")
    assert isinstance(echo, dict), f"the upstream did not echo the request: {payload}"
    return echo


async def post_json(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], **kwargs: Any
) -> dict[str, Any]:
    async with http.post(url, json=body, **kwargs) as response:
        payload = await response.json(content_type=None)
        assert isinstance(payload, dict)
        return payload


async def test_every_post_route_reaches_its_upstream_path(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--echo")))
    posts = [route for route in ROUTES if route.method == "POST"]
    assert len(posts) == 28
    for route in posts:
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
        if not route.path.endswith("/audio/speech"):  # speech answers audio; without input, an echoed 400
            body["input"] = "hi"
        async with http.post(served.at(route.path) + "?trace=1", json=body) as response:
            payload = await response.json(content_type=None)
            # The demo answers unknown paths (sdapi, tasks) with 404, POST /v1/audio/voices with 405 and
            # bodies it cannot serve with 400: its echo still shows what arrived, and llmswap relays its
            # status unchanged.
            assert response.status in (200, 400, 404, 405), (route.path, response.status, payload)
            assert response.headers["X-Demo-Model"] == "m"
        echo = echo_of(payload)
        assert echo["method"] == "POST"
        assert echo["path"] == route.upstream_path, route.path
        assert echo["query"] == {"trace": "1"}
        assert echo["body"]["model"] == "m"


async def test_prefixed_routes_strip_their_prefix(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--echo")))
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    echo = echo_of(await post_json(http, served.at("/v/chat/completions"), chat))
    assert echo["path"] == "/chat/completions"
    echo = echo_of(await post_json(http, served.at("/audioapi/v1/tasks/run"), {"model": "m", "task": "x"}))
    assert echo["path"] == "/v1/tasks/run"


async def test_get_routes_take_the_model_from_the_query(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--echo")))
    for path in ("/v1/audio/voices", "/props", "/sdapi/v1/loras"):
        async with http.get(served.at(path), params={"model": "m", "extra": "a b"}) as response:
            echo = echo_of(await response.json(content_type=None))
        assert (echo["method"], echo["path"]) == ("GET", path)
        assert echo["query"] == {"model": "m", "extra": "a b"}
    async with http.get(served.at("/props"), params={"model": "m"}) as response:
        props = await response.json()
    assert props["demo"]["model_name"] == "m"


async def test_alias_resolves_and_reaches_the_upstream_unchanged(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    config = exclusive_config(demo_config("m", "--echo", aliases=("fast",)), aliases={"fast": "m"})
    served = await serve_config(config)
    body = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    payload = await post_json(http, served.at("/v1/chat/completions"), body)
    assert echo_of(payload)["body"]["model"] == "fast"  # llama-swap sends the alias on without useModelName
    assert payload["choices"][0]["message"]["content"].startswith("demo m says")


async def test_use_model_name_and_filters_rewrite_json_bodies(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    filters = Filters(
        strip_params=("top_k", "chat_template_kwargs.debug"),
        set_params=MappingProxyType({"temperature": 0.2, "chat_template_kwargs.enable_thinking": False}),
        set_params_by_id=MappingProxyType({"m-creative": MappingProxyType({"temperature": 1.3})}),
    )
    model = demo_config("m", "--echo", use_model_name="upstream/m-q4", filters=filters)
    served = await serve_config(exclusive_config(model, aliases={"m-creative": "m"}))
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "top_k": 40,
        "chat_template_kwargs": {"debug": True, "keep": "yes"},
    }
    sent = echo_of(await post_json(http, served.at("/v1/chat/completions"), body))["body"]
    assert sent == {
        "model": "upstream/m-q4",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "temperature": 0.2,
        "chat_template_kwargs": {"keep": "yes", "enable_thinking": False},
    }
    # setParamsByID is keyed by the name the client sent and overrides setParams.
    payload = await post_json(http, served.at("/v1/chat/completions"), {**body, "model": "m-creative"})
    sent = echo_of(payload)["body"]
    assert sent["temperature"] == 1.3 and sent["model"] == "upstream/m-q4"


async def test_unfiltered_body_is_forwarded_byte_for_byte(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--echo")))
    raw = b'{ "input" : [ "\\u00e9t\\u00e9" ],\n  "model":"m", "dimensions": 4.0e0 }'
    async with http.post(served.at("/v1/embeddings"), data=raw,
                         headers={"Content-Type": "application/json", "X-Trace": "abc"}) as response:
        echo = echo_of(await response.json())
    assert echo["headers"]["Content-Length"] == str(len(raw))
    assert echo["body"] == json.loads(raw)
    assert echo["headers"]["X-Trace"] == "abc"
    assert echo["headers"]["X-Forwarded-For"] == "127.0.0.1"


async def test_hop_by_hop_headers_are_not_forwarded(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--echo")))
    headers = {"Connection": "keep-alive, X-Hop", "X-Hop": "1", "Keep-Alive": "timeout=5",
               "X-End-To-End": "2", "Expect": "100-continue", "X-Forwarded-For": "10.1.2.3"}
    body = {"model": "m", "input": "hi"}
    echo = echo_of(await post_json(http, served.at("/v1/embeddings"), body, headers=headers))
    sent = {name.lower(): value for name, value in echo["headers"].items()}
    assert "x-hop" not in sent and "keep-alive" not in sent and "expect" not in sent
    assert sent["x-end-to-end"] == "2"
    assert sent["x-forwarded-for"] == "10.1.2.3, 127.0.0.1"


async def test_json_body_without_json_content_type_and_urlencoded_forms(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--echo", use_model_name="renamed")))
    # What `curl -d '{...}'` sends: JSON labelled as a form. llama-server reads it; so does llmswap.
    raw = b'{"model": "m", "input": "hi"}'
    async with http.post(served.at("/v1/embeddings"), data=raw,
                         headers={"Content-Type": "application/x-www-form-urlencoded"}) as response:
        assert response.status == 200
        assert echo_of(await response.json())["body"]["model"] == "renamed"
    async with http.post(served.at("/v1/embeddings"), data={"model": "m", "input": "hi there"}) as response:
        assert response.status == 200
        echo = echo_of(await response.json())
    assert echo["body"] == {"model": "renamed", "input": "hi there"}


async def test_multipart_uploads_are_forwarded_intact(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--echo", use_model_name="whisper-large")))
    audio = os.urandom(300_000)
    form = aiohttp.FormData()
    form.add_field("file", audio, filename="clip.wav", content_type="audio/wav")
    form.add_field("language", "en")
    form.add_field("model", "m")  # after the file: the whole body must be read to find it
    async with http.post(served.at("/v1/audio/transcriptions"), data=form) as response:
        assert response.status == 200
        echo = echo_of(await response.json())
    assert echo["body"]["model"] == "whisper-large"
    assert echo["body"]["language"] == "en"
    assert echo["body"]["file"] == {"filename": "clip.wav", "content_type": "audio/wav", "size": len(audio)}

    image = os.urandom(50_000)
    form = aiohttp.FormData()
    form.add_field("model", "m")
    form.add_field("prompt", "a cat")
    form.add_field("image", image, filename="in.png", content_type="image/png")
    async with http.post(served.at("/v1/images/edits"), data=form) as response:
        assert response.status == 200
        echo = echo_of(await response.json())
    assert echo["body"]["model"] == "whisper-large"
    assert echo["body"]["image"]["size"] == len(image)


# Each case: (API keys llmswap accepts, headers of the request for b, headers of the later request for c).
PRIORITY_CASES = {
    "x-priority header": ((), {}, {"X-Priority": "5"}),
    "api key default": (
        (ApiKey("batch", priority=-1), ApiKey("interactive", priority=5)),
        {"Authorization": "Bearer batch"},
        {"Authorization": "Bearer interactive"},
    ),
    "header over key": (
        (ApiKey("interactive", priority=5),),
        {"Authorization": "Bearer interactive", "X-Priority": "-3"},
        {"Authorization": "Bearer interactive"},
    ),
}


@pytest.mark.parametrize("case", PRIORITY_CASES)
async def test_request_priority_orders_the_queue(
    serve_config: ServeConfig, http: aiohttp.ClientSession, case: str
) -> None:
    keys, b_headers, c_headers = PRIORITY_CASES[case]
    slow = demo_config("a", "--tokens-per-second", "20")
    served = await serve_config(exclusive_config(slow, demo_config("b"), demo_config("c"), api_keys=keys))
    swaps: list[str] = []
    seen: list[str] = []  # everything the router reported, for the failure message

    def record(item: object) -> None:
        seen.append(repr(item))
        if isinstance(item, SwapStarted):
            swaps.append(item.plan.model)

    served.router.add_observer(record)
    any_key = {"Authorization": f"Bearer {keys[-1].key}"} if keys else {}

    async def chat(model: str, headers: dict[str, str], tokens: int) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens}
        async with http.post(served.at("/v1/chat/completions"), json=body, headers=headers) as response:
            assert response.status == 200, await response.text()
            await response.read()

    # `a` streams long enough to hold the only slot until both others queue behind it; then its client
    # leaves, which frees the slot.
    hold = asyncio.create_task(chat("a", any_key, 10_000))
    await until(lambda: served.router.snapshot().in_flight.get("a", 0) == 1, what="a in flight")
    first = asyncio.create_task(chat("b", b_headers, 1))
    await until(lambda: served.router.snapshot().waiting.get("b", 0) == 1, what="b waiting")
    later = asyncio.create_task(chat("c", c_headers, 1))
    await until(lambda: served.router.snapshot().waiting.get("c", 0) == 1, what="c waiting")
    hold.cancel()
    await asyncio.gather(first, later)
    assert swaps == ["a", "c", "b"], "router events:\n" + "\n".join(seen)
