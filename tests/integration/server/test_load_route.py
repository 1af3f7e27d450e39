"""`POST /api/models/load/{model}` through real HTTP: starts a model through the router as a request would
and answers once it is ready, or with the reason it could not start."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from llmswap.process.state import ProcessState
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.wait import until
from tests.integration.server.conftest import ServeConfig


async def test_loading_by_alias_answers_once_the_model_is_ready(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--startup-delay", "0.3", aliases=("mm",)),
                                                 aliases={"mm": "m"}))
    async with http.post(served.at("/api/models/load/mm")) as response:
        assert response.status == 200
        body = await response.json()
    assert body["msg"] == "ok" and body["model"] == "m" and body["state"] == "ready"
    assert body["last_start_seconds"] > 0
    assert served.router.processes["m"].state is ProcessState.READY
    assert served.router.snapshot().in_flight.get("m", 0) == 0  # the load holds no request open


async def test_loading_goes_through_the_scheduler_which_stops_what_must_make_room(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("a"), demo_config("b")))
    async with http.post(served.at("/api/models/load/a")) as response:
        assert response.status == 200
    async with http.post(served.at("/api/models/load/b")) as response:
        assert response.status == 200
    assert served.router.processes["a"].state is ProcessState.STOPPED
    assert served.router.processes["b"].state is ProcessState.READY


async def test_a_model_that_cannot_start_answers_with_the_reason(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("bad", "--exit-after", "0")))
    async with http.post(served.at("/api/models/load/bad")) as response:
        assert response.status >= 500
        error = (await response.json())["error"]
    assert "exited" in error["message"]


async def test_loading_an_unknown_model_is_404(serve_config: ServeConfig, http: aiohttp.ClientSession):
    served = await serve_config(exclusive_config(demo_config("m")))
    async with http.post(served.at("/api/models/load/nope")) as response:
        assert response.status == 404
        error = (await response.json())["error"]
    assert error["message"].startswith("model not found") and "nope" in error["message"]
    assert served.router.processes["m"].state is ProcessState.STOPPED


async def test_a_load_whose_client_leaves_while_the_model_starts_leaves_the_queue(
    serve_config: ServeConfig,
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--startup-delay", "30")))

    def waiting() -> int:
        return served.router.snapshot().waiting.get("m", 0)

    async with aiohttp.ClientSession() as client:
        load = asyncio.create_task(client.post(served.at("/api/models/load/m")))
        await until(lambda: waiting() == 1, what="the load waiting for the model")
        load.cancel()  # the client hangs up
        with contextlib.suppress(asyncio.CancelledError):
            await load
    await until(lambda: waiting() == 0, what="the abandoned load leaving the queue")
