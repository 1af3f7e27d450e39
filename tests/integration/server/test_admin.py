"""Admin and info routes through real HTTP: /v1/models, /running, the unload routes, health, version, and
the route-level errors (unknown path, wrong method), with demo upstreams where a model must run."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import psutil

from llmswap import __version__
from llmswap.config.model import (
    Capabilities,
    Config,
    GroupConfig,
    ModelConfig,
    PeerConfig,
    RouterConfig,
    RoutingConfig,
)
from llmswap.process.state import ProcessState
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.wait import eventually


def pid_gone(pid: int) -> bool:
    if not psutil.pid_exists(pid):
        return True
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def side_by_side_config(*models: ModelConfig, **overrides) -> Config:
    """Every model in one group that neither swaps nor is exclusive: they all run at once."""
    group = GroupConfig("together", swap=False, exclusive=False, members=tuple(m.id for m in models))
    routing = RoutingConfig(router=RouterConfig(groups={"together": group}))
    return Config(models={m.id: m for m in models}, routing=routing, **overrides)


async def load(served, model: str) -> int:
    """Bring a model up through the router, as any request would, and return its PID."""
    async with served.router.acquire(model) as process:
        assert process.pid is not None
        return process.pid


async def test_health_routes_answer_ok(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    for path in ("/health", "/wol-health"):
        async with http.get(served.at(path)) as resp:
            assert resp.status == 200
            assert await resp.text() == "OK"
    async with http.head(served.at("/health")) as resp:
        assert resp.status == 200


async def test_root_redirects_to_the_ui(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    async with http.get(served.at("/"), allow_redirects=False) as resp:
        assert resp.status == 302
        assert resp.headers["Location"] == "/ui"


async def test_version(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    async with http.get(served.at("/api/version")) as resp:
        assert resp.status == 200
        assert await resp.json() == {"version": __version__}


async def test_model_list_shows_listed_models_aliases_peers_and_load_status(serve_config, http):
    shown = demo_config("shown", name="Shown", description="a demo", aliases=("s-alias",),
                        capabilities=Capabilities(input=("text",), output=("text",), context=2048))
    hidden = demo_config("hidden", unlisted=True)
    config = exclusive_config(
        shown, hidden, aliases={"s-alias": "shown"}, include_aliases_in_list=True,
        peers={"far": PeerConfig("far", "http://127.0.0.1:9", models=("remote-model",))},
    )
    served = await serve_config(config)

    async with http.get(served.at("/v1/models")) as resp:
        assert resp.status == 200
        body = await resp.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["far/remote-model", "s-alias", "shown"]
    assert all(m["status"] == {"value": "unloaded"} for m in body["data"])
    model = body["data"][2]
    assert model["name"] == "Shown" and model["description"] == "a demo"
    assert model["meta"]["llamaswap"] == {"type": "model", "aliases": ["s-alias"]}
    assert model["context_length"] == 2048 and model["meta"]["n_ctx"] == 2048
    assert body["data"][1]["meta"]["llamaswap"] == {"type": "alias", "modelID": "shown"}
    assert body["data"][0]["meta"]["llamaswap"] == {"type": "peer", "peerID": "far"}

    await load(served, "shown")
    async with http.get(served.at("/models")) as resp:
        assert resp.status == 200
        statuses = {m["id"]: m["status"]["value"] for m in (await resp.json())["data"]}
    assert statuses == {"far/remote-model": "unloaded", "s-alias": "loaded", "shown": "loaded"}


async def test_model_list_echoes_an_allowed_origin(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    async with http.get(served.at("/v1/models"), headers={"Origin": "http://localhost:3000"}) as resp:
        assert resp.headers.getall("Access-Control-Allow-Origin") == ["http://localhost:3000"]


async def test_running_lists_the_loaded_model_with_its_process_details(serve_config, http):
    model = demo_config("m", ttl=300.0, name="Demo M")
    served = await serve_config(exclusive_config(model, demo_config("other")))
    async with http.get(served.at("/running")) as resp:
        assert await resp.json() == {"running": []}

    pid = await load(served, "m")
    async with http.get(served.at("/running")) as resp:
        assert resp.status == 200
        [entry] = (await resp.json())["running"]
    assert entry["model"] == "m" and entry["state"] == "ready"
    assert entry["cmd"] == model.cmd_text and entry["proxy"] == model.proxy
    assert entry["ttl"] == 300 and entry["name"] == "Demo M" and entry["description"] == ""
    assert entry["pid"] == pid and psutil.pid_exists(pid)
    assert entry["in_flight"] == 0 and entry["waiting"] == 0
    assert isinstance(entry["last_start_seconds"], float) and entry["last_start_seconds"] > 0


async def test_running_counts_a_request_in_flight(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    async with served.router.acquire("m"), http.get(served.at("/running")) as resp:
        [entry] = (await resp.json())["running"]
    assert entry["in_flight"] == 1


async def test_get_unload_returns_once_every_process_is_dead(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    pid = await load(served, "m")
    async with http.get(served.at("/unload")) as resp:
        assert resp.status == 200
        assert await resp.text() == "OK"
    assert pid_gone(pid)
    assert served.router.processes["m"].state is ProcessState.STOPPED
    async with http.get(served.at("/running")) as resp:
        assert await resp.json() == {"running": []}


async def test_api_unload_all_answers_json(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    pid = await load(served, "m")
    async with http.post(served.at("/api/models/unload")) as resp:
        assert resp.status == 200
        assert await resp.json() == {"msg": "ok"}
    assert pid_gone(pid)


async def test_unload_one_model_by_alias_leaves_the_others(serve_config, http):
    a = demo_config("a", aliases=("first",))
    config = side_by_side_config(a, demo_config("b"), aliases={"first": "a"})
    served = await serve_config(config)
    pid_a = await load(served, "a")
    pid_b = await load(served, "b")
    async with http.post(served.at("/api/models/unload/first")) as resp:
        assert resp.status == 200
        assert await resp.text() == "OK"
    assert pid_gone(pid_a)
    assert served.router.processes["b"].state is ProcessState.READY
    assert not pid_gone(pid_b)


async def test_unloading_a_stopped_model_is_ok(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    async with http.post(served.at("/api/models/unload/m")) as resp:
        assert resp.status == 200
        assert await resp.text() == "OK"


async def test_unloading_an_unknown_model_is_404(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    async with http.post(served.at("/api/models/unload/nope")) as resp:
        assert resp.status == 404
        error = (await resp.json())["error"]
    assert error["message"].startswith("model not found")
    assert "nope" in error["message"]
    assert error["type"] == "invalid_request_error" and error["code"] == "not_found"


async def test_unload_with_a_slash_in_the_model_name(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("org/model")))
    pid = await load(served, "org/model")
    async with http.post(served.at("/api/models/unload/org/model")) as resp:
        assert resp.status == 200
    assert pid_gone(pid)


async def test_waiters_for_an_unloaded_model_get_500(serve_config, http):
    slow = demo_config("m", "--startup-delay", "30")
    served = await serve_config(exclusive_config(slow))
    waiting = asyncio.create_task(http.get(served.at("/upstream/m/health")))

    async def loading() -> bool:
        return served.router.processes["m"].state is ProcessState.STARTING

    await eventually(loading, what="model m starting")
    async with http.post(served.at("/api/models/unload/m")) as resp:
        assert resp.status == 200
    resp = await asyncio.wait_for(waiting, 15)
    async with resp:
        assert resp.status == 500
        error = (await resp.json())["error"]
    assert "unload" in error["message"]
    assert served.router.processes["m"].state is ProcessState.STOPPED


async def test_unknown_path_is_404_in_the_envelope(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    async with http.get(served.at("/v2/nothing")) as resp:
        assert resp.status == 404
        assert resp.content_type == "application/json"
        error = (await resp.json())["error"]
    assert error == {"message": "404 page not found: no route for GET /v2/nothing",
                     "type": "invalid_request_error", "param": None, "code": "not_found"}


async def test_unknown_path_as_text_when_asked(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    async with http.get(served.at("/v2/nothing"), headers={"Accept": "text/plain"}) as resp:
        assert resp.status == 404
        assert await resp.text() == "llmswap: 404 page not found: no route for GET /v2/nothing\n"


async def test_wrong_method_is_405_with_allow(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    async with http.delete(served.at("/v1/models")) as resp:
        assert resp.status == 405
        assert set(resp.headers["Allow"].split(",")) == {"GET", "HEAD"}
        error = (await resp.json())["error"]
    assert error["message"] == "method DELETE is not allowed on /v1/models; use GET, HEAD"
    assert error["code"] == "method_not_allowed"
    async with http.post(served.at("/health")) as resp:
        assert resp.status == 405


async def test_no_route_ever_answers_with_html_or_a_traceback(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    async with http.put(served.at("/running"), headers={"Accept": "*/*"}) as resp:
        text = await resp.text()
    assert resp.status == 405
    assert "<html" not in text.lower() and "Traceback" not in text


async def test_client_leaving_during_unload_still_stops_the_model(serve_config):
    # A model that ignores SIGTERM takes its whole unloadTimeout to stop: the client gives up long before.
    served = await serve_config(exclusive_config(demo_config("m", "--ignore-sigterm", unload_timeout=1.0)))
    pid = await load(served, "m")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.05)) as impatient:
        with contextlib.suppress(TimeoutError):
            async with impatient.get(served.at("/unload")) as resp:
                await resp.read()

    async def stopped() -> bool:
        # The pid disappears a moment before the process object records the stop: wait for both.
        return pid_gone(pid) and served.router.processes["m"].state is ProcessState.STOPPED

    await eventually(stopped, what="the unloaded model's process exiting")
