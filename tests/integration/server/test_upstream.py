"""`/upstream/<model>/<path>` through real HTTP against demo upstreams: redirects, requests forwarded
untouched, swaps, `ignorePaths` answered 409 while the model is down, peers."""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp
import psutil

from llmswap.config.model import Filters, PeerConfig
from llmswap.process.state import ProcessState
from tests.helpers.demo import running_demo
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.wait import eventually


def echo_of(payload: dict) -> dict:
    return payload["echo"]


async def test_bare_upstream_redirects_to_the_models_page(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    async with http.get(served.at("/upstream"), allow_redirects=False) as resp:
        assert resp.status == 302
        assert resp.headers["Location"] == "/ui/models"


async def test_model_without_trailing_slash_redirects_keeping_the_query(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("org/model", aliases=("short",)),
                                                 aliases={"short": "org/model"}))
    async with http.get(served.at("/upstream/org/model?a=1&b=two%20words"), allow_redirects=False) as resp:
        assert resp.status == 301
        assert resp.headers["Location"] == "/upstream/org/model/?a=1&b=two%20words"
    async with http.post(served.at("/upstream/short"), allow_redirects=False) as resp:
        assert resp.status == 308
        assert resp.headers["Location"] == "/upstream/short/"
    # Redirects answer without starting anything.
    assert served.router.processes["org/model"].state is ProcessState.STOPPED


async def test_unknown_model_is_404(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    for path in ("/upstream/nope/props", "/upstream/"):
        async with http.get(served.at(path)) as resp:
            assert resp.status == 404, path
            error = (await resp.json())["error"]
        assert error["message"].startswith("model not found"), path


async def test_request_is_forwarded_untouched_and_starts_the_model(serve_config, http):
    # Filters and useModelName exist on the model: /upstream must not apply them.
    model = demo_config("m", "--echo", aliases=("alias-m",), use_model_name="renamed",
                        filters=Filters(strip_params=("temperature",), set_params={"top_k": 5}))
    served = await serve_config(exclusive_config(model, aliases={"alias-m": "m"}))
    body = json.dumps({"model": "alias-m", "temperature": 0.25,
                       "messages": [{"role": "user", "content": "hi"}]})
    async with http.post(
        served.at("/upstream/alias-m/v1/chat/completions?trace=yes&x=a%20b"), data=body,
        headers={"Content-Type": "application/json", "X-Trace": "t-1"},
    ) as resp:
        assert resp.status == 200
        assert resp.headers["X-Demo-Model"] == "m"
        echo = echo_of(await resp.json())
    assert echo["method"] == "POST"
    assert echo["path"] == "/v1/chat/completions"
    assert echo["query"] == {"trace": "yes", "x": "a b"}
    assert echo["body"] == json.loads(body)
    assert {k.lower(): v for k, v in echo["headers"].items()}["x-trace"] == "t-1"
    assert served.router.processes["m"].state is ProcessState.READY


async def test_root_of_the_upstream_is_reachable_with_the_slash(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m", "--echo")))
    async with http.get(served.at("/upstream/m/")) as resp:
        # The demo has no page at "/": its own 404 comes back, proving the request reached it.
        assert resp.status == 404
        assert resp.headers["X-Demo-Model"] == "m"
        assert echo_of(await resp.json())["path"] == "/"


async def test_upstream_request_swaps_models(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("a"), demo_config("b")))
    async with http.get(served.at("/upstream/a/health")) as resp:
        assert resp.status == 200
        assert resp.headers["X-Demo-Model"] == "a"
    pid_a = served.router.processes["a"].pid
    assert pid_a is not None
    async with http.get(served.at("/upstream/b/props")) as resp:
        assert resp.status == 200
        assert (await resp.json())["demo"]["model_name"] == "b"
    assert served.router.processes["a"].state is ProcessState.STOPPED
    assert not psutil.pid_exists(pid_a) or psutil.Process(pid_a).status() == psutil.STATUS_ZOMBIE


async def test_ignored_path_is_409_while_the_model_is_down_and_forwarded_once_it_is_up(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m", "--echo")))
    async with http.get(served.at("/upstream/m/assets/app.js")) as resp:
        assert resp.status == 409
        error = (await resp.json())["error"]
    assert error["message"] == "model m is not loaded; path matches upstream.ignorePaths"
    assert error["code"] == "conflict"
    assert served.router.processes["m"].state is ProcessState.STOPPED

    async with http.get(served.at("/upstream/m/health")) as resp:
        assert resp.status == 200
    async with http.get(served.at("/upstream/m/assets/app.js")) as resp:
        assert resp.headers["X-Demo-Model"] == "m"  # the demo's own answer, not llmswap's 409
        assert echo_of(await resp.json())["path"] == "/assets/app.js"


async def test_custom_ignore_paths(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m"), upstream_ignore_paths=(r"^/metrics$",)))
    async with http.get(served.at("/upstream/m/metrics")) as resp:
        assert resp.status == 409
    async with http.get(served.at("/upstream/m/app.js")) as resp:
        assert resp.status == 404  # no longer ignored: the model started and the demo answered
        assert resp.headers["X-Demo-Model"] == "m"


async def test_start_failure_is_a_500(serve_config, http):
    broken = demo_config("m", "--exit-after", "0")
    served = await serve_config(exclusive_config(broken))
    async with http.get(served.at("/upstream/m/health")) as resp:
        assert resp.status == 500
        error = (await resp.json())["error"]
    assert error["type"] == "server_error"


async def test_peer_models_are_forwarded_with_the_peer_key(serve_config, http):
    async with running_demo("remote", ["--echo"]) as peer:
        config = exclusive_config(
            demo_config("m"),
            peers={"far": PeerConfig("far", peer.url, models=("remote-model", "only-here"),
                                     api_key="peer-key")},
        )
        served = await serve_config(config)
        async with http.post(served.at("/upstream/far/remote-model/v1/embeddings?q=1"),
                             json={"model": "remote-model", "input": "x"}) as resp:
            assert resp.status == 200
            echo = echo_of(await resp.json())
        assert echo["path"] == "/v1/embeddings" and echo["query"] == {"q": "1"}
        assert echo["body"] == {"model": "remote-model", "input": "x"}
        headers = {k.lower(): v for k, v in echo["headers"].items()}
        assert headers["authorization"] == "Bearer peer-key" and headers["x-api-key"] == "peer-key"
        assert headers["host"] == peer.url.removeprefix("http://")
        async with http.get(served.at("/upstream/only-here/props")) as resp:
            assert resp.status == 200
            assert resp.headers["X-Demo-Model"] == "remote"
    assert served.router.processes["m"].state is ProcessState.STOPPED


async def test_client_leaving_while_the_model_loads_leaves_the_queue(serve_config):
    served = await serve_config(exclusive_config(demo_config("m", "--startup-delay", "30")))

    async def waiting_count() -> int:
        return served.router.snapshot().waiting.get("m", 0)

    async with aiohttp.ClientSession() as client:
        request = asyncio.create_task(client.get(served.at("/upstream/m/health")))

        async def queued() -> bool:
            return await waiting_count() == 1

        await eventually(queued, what="the request waiting for the load")
        request.cancel()  # the client hangs up
        with contextlib.suppress(asyncio.CancelledError):
            await request

    async def left() -> bool:
        return await waiting_count() == 0

    await eventually(left, what="the abandoned request leaving the queue")
    # As in llama-swap, the load already under way goes on; only the waiter is gone.
    assert served.router.snapshot().in_flight.get("m", 0) == 0
