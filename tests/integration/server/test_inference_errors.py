"""Every error an inference request can meet, with llama-swap's status codes, in the OpenAI envelope."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from llmswap.process.state import ProcessState
from tests.helpers.demo import free_port
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.wait import until
from tests.integration.server.conftest import ServeConfig

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def error_of(response: aiohttp.ClientResponse) -> dict[str, Any]:
    payload = await response.json()
    assert set(payload) == {"error"}, payload
    error = payload["error"]
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
    return error


async def test_requests_without_a_usable_model(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    said = ('no model id could be identified: name one as "model" in the JSON body (a form field for '
            "uploads, or ?model= in the URL); available are m")
    async with http.post(served.at("/v1/chat/completions"), json=CHAT) as response:
        assert response.status == 404
        assert (await error_of(response))["message"] == said
    async with http.get(served.at("/props")) as response:
        assert response.status == 404
        assert (await error_of(response))["message"] == said
    async with http.post(served.at("/v1/chat/completions"), json={**CHAT, "model": "gpt-9"}) as response:
        assert response.status == 404
        error = await error_of(response)
        assert error["code"] == "not_found"
        assert error["message"] == "no router for requested model 'gpt-9': available are m"
    async with http.post(served.at("/v1/chat/completions"), json={**CHAT, "model": "gpt-9"},
                         headers={"Accept": "text/plain"}) as response:
        assert response.status == 404
        assert await response.text() == "llmswap: no router for requested model 'gpt-9': available are m\n"
    assert served.router.processes["m"].state is ProcessState.STOPPED


async def test_malformed_bodies_are_400_never_500(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    for raw in (b'{"model": "m",', b"\xff\xfe", b'{"model": ["m"]}'):
        async with http.post(served.at("/v1/chat/completions"), data=raw,
                             headers={"Content-Type": "application/json"}) as response:
            assert response.status == 400, raw
            error = await error_of(response)
            assert error["type"] == "invalid_request_error" and error["code"] == "bad_request"
    async with http.post(served.at("/v1/audio/transcriptions"), data=b"--x\r\n",
                         headers={"Content-Type": "multipart/form-data"}) as response:
        assert response.status == 400
        assert "boundary" in (await error_of(response))["message"]
    async with http.post(served.at("/v1/chat/completions"), json={**CHAT, "model": "m"},
                         headers={"X-Priority": "urgent"}) as response:
        assert response.status == 400
        assert "X-Priority must be an integer" in (await error_of(response))["message"]
    assert served.router.processes["m"].state is ProcessState.STOPPED


async def test_bodies_over_the_limit_are_413(serve_config: ServeConfig, http: aiohttp.ClientSession) -> None:
    served = await serve_config(exclusive_config(demo_config("m"), max_request_body=4096))
    big = {**CHAT, "model": "m", "messages": [{"role": "user", "content": "x" * 8192}]}
    async with http.post(served.at("/v1/chat/completions"), json=big) as response:
        assert response.status == 413
        error = await error_of(response)
        assert "4096 bytes" in error["message"] and "maxRequestBodySize" in error["message"]

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: the limit is enforced while reading
        yield b'{"model": "m", "input": "'
        for _ in range(10):
            yield b"y" * 1024
        yield b'"}'

    async with http.post(served.at("/v1/embeddings"), data=chunked(),
                         headers={"Content-Type": "application/json"}) as response:
        assert response.status == 413
    assert served.router.processes["m"].state is ProcessState.STOPPED


async def test_concurrency_limit_is_429_with_retry_after(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    model = demo_config("m", "--tokens-per-second", "20", concurrency_limit=1)
    served = await serve_config(exclusive_config(model))
    body = {**CHAT, "model": "m", "max_tokens": 10_000, "stream": True}
    async with http.post(served.at("/v1/chat/completions"), json=body) as streaming:
        assert streaming.status == 200
        await streaming.content.readline()
        # llama-swap answers 429 in JSON even to a client that asked for text: clients back off on the body.
        async with http.post(served.at("/v1/chat/completions"), json={**CHAT, "model": "m"},
                             headers={"Accept": "text/plain"}) as response:
            assert response.status == 429
            assert int(response.headers["Retry-After"]) >= 1
            error = await error_of(response)
            assert (error["type"], error["code"]) == ("rate_limit_error", "concurrency_limit")


async def test_a_model_that_fails_to_start_is_500_with_the_reason(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    crashing = demo_config("crash", "--exit-after", "0")
    unhealthy = demo_config("sick", "--never-healthy", health_check_timeout=1.0)
    served = await serve_config(exclusive_config(crashing, unhealthy))
    async with http.post(served.at("/v1/chat/completions"), json={**CHAT, "model": "crash"}) as response:
        assert response.status == 500
        error = await error_of(response)
        assert "upstream command exited prematurely" in error["message"]
        assert error["type"] == "server_error"
    async with http.post(served.at("/v1/chat/completions"), json={**CHAT, "model": "sick"}) as response:
        assert response.status == 500
        assert "health check timed out after 1s" in (await error_of(response))["message"]
    await until(lambda: served.router.processes["sick"].state is ProcessState.STOPPED, what="sick stopped")


async def test_an_unreachable_upstream_is_502(serve_config: ServeConfig, http: aiohttp.ClientSession) -> None:
    # The process runs (its own port) but the configured proxy address has nothing listening.
    nowhere = f"http://127.0.0.1:{free_port()}"
    served = await serve_config(exclusive_config(demo_config("m", check_endpoint="none", proxy=nowhere)))
    async with http.post(served.at("/v1/chat/completions"), json={**CHAT, "model": "m"}) as response:
        assert response.status == 502
        error = await error_of(response)
        assert error["message"].startswith("upstream proxy error: ")
        assert nowhere.removeprefix("http://") in error["message"]
        assert (error["type"], error["code"]) == ("server_error", "bad_gateway")
    # The failed request released its slot: the next one gets the same answer, not a hang.
    embedding = {"model": "m", "input": "x"}
    async with asyncio.timeout(15), http.post(served.at("/v1/embeddings"), json=embedding) as response:
        assert response.status == 502
    await until(lambda: served.router.snapshot().in_flight.get("m", 0) == 0, what="no request in flight")
