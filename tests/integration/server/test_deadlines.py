"""Request deadlines over real demo upstreams: `X-Deadline-Ms`, key and model defaults, `onDeadline: reject`.

A model that is not loaded needs a load before it can answer; a deadline shorter than that load is
hopeless, and with `onDeadline: reject` the request is answered 503 in OpenAI's error body at once,
before anything starts. The same request with room to spare is served.
"""

from __future__ import annotations

import dataclasses

import aiohttp

from llmswap.config.model import ApiKey, SchedulerConfig
from llmswap.process.state import ProcessState
from tests.helpers.models import demo_config, exclusive_config
from tests.integration.server.conftest import ServeConfig

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def deadline_config(**scheduler: str):
    config = exclusive_config(demo_config("m"), demo_config("n", deadline_ms=50.0),
                              api_keys=(ApiKey("sk-tight", deadline_ms=50.0), ApiKey("sk-loose")))
    routing = dataclasses.replace(config.routing, scheduler=SchedulerConfig(**scheduler))
    return dataclasses.replace(config, routing=routing)


async def test_a_hopeless_deadline_is_503_before_any_load_and_a_loose_one_is_served(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(deadline_config(prioritizer="edf", on_deadline="reject"))
    loose = {"Authorization": "Bearer sk-loose"}
    async with http.post(served.at("/v1/chat/completions"), json=CHAT,
                         headers={**loose, "X-Deadline-Ms": "50"}) as response:
        assert response.status == 503
        error = (await response.json())["error"]
        assert (error["type"], error["code"]) == ("server_error", "deadline_missed")
        assert "X-Deadline-Ms" in error["message"]
    assert served.router.processes["m"].state is ProcessState.STOPPED, "no load for a hopeless request"

    # The API key's default and the model's default apply without the header.
    async with http.post(served.at("/v1/chat/completions"), json=CHAT,
                         headers={"Authorization": "Bearer sk-tight"}) as response:
        assert response.status == 503
    async with http.post(served.at("/v1/chat/completions"), json={**CHAT, "model": "n"},
                         headers=loose) as response:
        assert response.status == 503
    assert served.router.processes["n"].state is ProcessState.STOPPED

    async with http.post(served.at("/v1/chat/completions"), json=CHAT,
                         headers={**loose, "X-Deadline-Ms": "60000"}) as response:
        assert response.status == 200, await response.text()

    async with http.get(served.at("/metrics"), headers={"Authorization": "Bearer sk-loose"}) as response:
        text = await response.text()
    assert "llmswap_deadline_misses_total 3.0" in text
    assert 'llmswap_rejections_total{reason="deadline"} 3.0' in text


async def test_a_malformed_deadline_header_is_400(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(deadline_config())
    for bad in ("soon", "-5", "0", "nan"):
        async with http.post(served.at("/v1/chat/completions"), json=CHAT,
                             headers={"Authorization": "Bearer sk-loose", "X-Deadline-Ms": bad}) as response:
            assert response.status == 400, bad
            assert "X-Deadline-Ms must be a positive number of milliseconds" in (await response.json())[
                "error"]["message"]
    assert served.router.processes["m"].state is ProcessState.STOPPED


async def test_with_on_deadline_ignore_a_late_request_is_counted_and_served(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(deadline_config())
    async with http.post(served.at("/v1/chat/completions"), json=CHAT,
                         headers={"Authorization": "Bearer sk-loose", "X-Deadline-Ms": "50"}) as response:
        assert response.status == 200
    async with http.get(served.at("/metrics"), headers={"Authorization": "Bearer sk-loose"}) as response:
        assert "llmswap_deadline_misses_total 1.0" in await response.text()
