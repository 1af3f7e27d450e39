"""Peers through real HTTP: a standalone `--echo` demo plays the remote backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import MappingProxyType
from typing import Any

import aiohttp
import pytest

from llmswap.config.model import ApiKey, Filters, PeerConfig
from tests.helpers.demo import DemoProcess, free_port, running_demo
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.sse import parse_events
from tests.integration.server.conftest import ServeConfig

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def remote() -> AsyncIterator[DemoProcess]:
    async with running_demo("remote", ["--echo"]) as demo:
        yield demo


def peer(remote: DemoProcess, **overrides: Any) -> PeerConfig:
    settings: dict[str, Any] = {"models": ("qwen/qwen3-8b", "mistral", "shared"), "api_key": "peer-secret"}
    settings.update(overrides)
    return PeerConfig("lan", remote.url, **settings)


async def echo(response: aiohttp.ClientResponse) -> dict[str, Any]:
    assert response.status == 200, await response.text()
    payload = await response.json()
    assert response.headers["X-Demo-Model"] == "remote"
    return dict(payload["echo"])


async def test_full_name_reaches_the_peer_with_its_own_name_key_and_host(
    serve_config: ServeConfig, http: aiohttp.ClientSession, remote: DemoProcess
) -> None:
    filters = Filters(strip_params=("top_k",), set_params=MappingProxyType({"temperature": 0.1}))
    served = await serve_config(exclusive_config(peers={"lan": peer(remote, filters=filters)}))
    body = {"model": "lan/qwen/qwen3-8b", "messages": MESSAGES, "max_tokens": 2, "top_k": 5}
    headers = {"Authorization": "Bearer client-key", "x-api-key": "client-key"}
    async with http.post(served.at("/v1/chat/completions?x=1"), json=body, headers=headers) as response:
        sent = await echo(response)
    assert sent["path"] == "/v1/chat/completions" and sent["query"] == {"x": "1"}
    expected = {"model": "qwen/qwen3-8b", "messages": MESSAGES, "max_tokens": 2, "temperature": 0.1}
    assert sent["body"] == expected  # renamed for the peer, its filters applied
    assert sent["headers"]["Authorization"] == "Bearer peer-secret"
    assert sent["headers"]["x-api-key"] == "peer-secret"
    assert sent["headers"]["Host"] == remote.url.removeprefix("http://")


async def test_bare_name_when_one_peer_lists_it_and_local_models_win(
    serve_config: ServeConfig, http: aiohttp.ClientSession, remote: DemoProcess
) -> None:
    local = demo_config("shared", "--echo")
    served = await serve_config(exclusive_config(local, peers={"lan": peer(remote)}))
    async with http.post(served.at("/v1/embeddings"), json={"model": "mistral", "input": "x"}) as response:
        assert (await echo(response))["body"]["model"] == "mistral"
    async with http.post(served.at("/v1/embeddings"), json={"model": "shared", "input": "x"}) as response:
        assert response.headers["X-Demo-Model"] == "shared"  # the local model, not the peer's
    async with http.post(served.at("/v1/embeddings"), json={"model": "lan/shared", "input": "x"}) as response:
        assert (await echo(response))["body"]["model"] == "shared"


async def test_streams_forms_and_queries_reach_the_peer(
    serve_config: ServeConfig, http: aiohttp.ClientSession, remote: DemoProcess
) -> None:
    served = await serve_config(exclusive_config(peers={"lan": peer(remote)}))
    body = {"model": "lan/mistral", "messages": MESSAGES, "max_tokens": 3, "stream": True}
    async with http.post(served.at("/v1/chat/completions"), json=body) as response:
        assert response.headers["X-Accel-Buffering"] == "no"
        events = parse_events((await response.read()).decode())
    assert events[0].json()["echo"]["body"]["model"] == "mistral"
    text = "".join(event.json()["choices"][0]["delta"].get("content", "") for event in events[:-1])
    assert text == "demo remote says:"

    form = aiohttp.FormData()
    form.add_field("file", b"RIFF" + bytes(2000), filename="a.wav", content_type="audio/wav")
    form.add_field("model", "lan/mistral")
    async with http.post(served.at("/v1/audio/transcriptions"), data=form) as response:
        sent = await echo(response)
    assert sent["body"]["model"] == "mistral" and sent["body"]["file"]["size"] == 2004

    async with http.get(served.at("/v1/audio/voices"), params={"model": "lan/mistral", "x": "y"}) as response:
        assert (await echo(response))["query"] == {"model": "mistral", "x": "y"}


async def test_llmswap_keys_are_not_passed_to_a_peer_without_its_own(
    serve_config: ServeConfig, http: aiohttp.ClientSession, remote: DemoProcess
) -> None:
    config = exclusive_config(peers={"lan": peer(remote, api_key="")}, api_keys=(ApiKey("llmswap-key"),))
    served = await serve_config(config)
    headers = {"Authorization": "Bearer llmswap-key"}
    body = {"model": "lan/mistral", "input": "x"}
    async with http.post(served.at("/v1/embeddings"), json=body, headers=headers) as response:
        sent = await echo(response)
    assert "Authorization" not in sent["headers"] and "x-api-key" not in sent["headers"]


async def test_an_unreachable_peer_is_502(serve_config: ServeConfig, http: aiohttp.ClientSession) -> None:
    gone = PeerConfig("lan", f"http://127.0.0.1:{free_port()}", ("mistral",))
    served = await serve_config(exclusive_config(peers={"lan": gone}))
    async with http.post(served.at("/v1/embeddings"), json={"model": "mistral", "input": "x"}) as response:
        assert response.status == 502
        error = (await response.json())["error"]
    assert error["message"].startswith("peer proxy error: ")
    assert error["code"] == "bad_gateway"
