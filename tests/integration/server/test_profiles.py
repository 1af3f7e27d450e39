"""Profiles over real HTTP: the routes' bodies and errors, pins before aliases and routing, a disabled pin, a
pin to a selector, `/upstream` pins, the listing, the event a switch publishes, and the reset on reload."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import aiohttp

from llmswap.config.model import Config, ProfileConfig, SelectorConfig
from llmswap.server.observe.events import Event
from llmswap.server.reload import apply_config
from tests.helpers.models import demo_config, exclusive_config
from tests.integration.server.conftest import ServeConfig, Served

MESSAGES = [{"role": "user", "content": "hi"}]


def profiled() -> Config:
    a = demo_config("a", "--echo", aliases=("alpha",))
    b = demo_config("b", "--echo")
    profiles = {
        "work": ProfileConfig("work", "office hours", MappingProxyType(
            {"chat": "b", "alpha": "b", "a": "", "pick": "fixed"})),
        "home": ProfileConfig("home", "", MappingProxyType({"chat": "a"})),
    }
    config = exclusive_config(a, b)
    selectors = {"fixed": SelectorConfig("fixed", "pin", ("a",))}
    return Config(models=config.models, aliases=MappingProxyType({"alpha": "a"}), routing=config.routing,
                  selectors=MappingProxyType(selectors), profiles=MappingProxyType(profiles))


async def chat(http: aiohttp.ClientSession, served: Served, model: str) -> tuple[int, dict[str, Any], str]:
    """(status, JSON answer, which demo answered) of a short chat naming `model`."""
    body = {"model": model, "messages": MESSAGES, "max_tokens": 1}
    async with http.post(served.at("/v1/chat/completions"), json=body) as response:
        return response.status, await response.json(), response.headers.get("X-Demo-Model", "")


async def put_active(http: aiohttp.ClientSession, served: Served, body: Any) -> tuple[int, Any]:
    async with http.put(served.at("/api/profiles/active"), json=body) as response:
        return response.status, await response.json()


async def test_none_is_active_at_start_and_the_list_is_sorted_with_disabled_pins_empty(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(profiled())
    async with http.get(served.at("/api/profiles")) as response:
        assert await response.json() == {"active": None, "profiles": [
            {"id": "home", "description": "", "pins": {"chat": "a"}},
            {"id": "work", "description": "office hours",
             "pins": {"chat": "b", "alpha": "b", "a": "", "pick": "fixed"}},
        ]}


async def test_bad_switch_requests_are_refused_and_change_nothing(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(profiled())
    assert (await put_active(http, served, {"name": "home"}))[0] == 200
    for body, status, message in [
        ([1], 400, "invalid profile request"),
        ({}, 400, "profile name is required"),
        ({"name": 5}, 400, "profile name must be a string or null"),
        ({"name": "missing"}, 404, 'profile "missing" not found'),
    ]:
        got_status, answer = await put_active(http, served, body)
        assert (got_status, answer["error"]["message"]) == (status, message)
    async with http.get(served.at("/api/profiles")) as response:
        assert (await response.json())["active"] == "home"


async def test_pins_apply_before_aliases_and_routing_and_may_name_a_selector(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(profiled())
    status, _, _ = await chat(http, served, "chat")
    assert status == 404  # no profile active: "chat" names nothing
    assert await put_active(http, served, {"name": "work"}) == (200, {"active": "work"})
    status, answer, demo = await chat(http, served, "chat")
    assert (status, demo, answer["echo"]["body"]["model"]) == (200, "b", "b")  # the upstream sees the target
    assert (await chat(http, served, "alpha"))[2] == "b"  # the pin shadows the alias
    status, answer, _ = await chat(http, served, "a")
    assert (status, answer["error"]["message"]) == (  # disabled
        404, "no model id could be identified: the active profile disables 'a' (PUT /api/profiles/active "
             "changes it)")
    status, answer, demo = await chat(http, served, "pick")
    assert (demo, answer["echo"]["body"]["model"]) == ("a", "a")  # the pin names a selector, which picks a
    assert await put_active(http, served, {"name": None}) == (200, {"active": None})
    assert (await chat(http, served, "a"))[2] == "a"


async def test_upstream_pins_rewrite_the_path_and_leave_the_body_alone(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(profiled())
    await put_active(http, served, {"name": "work"})
    body = {"model": "public", "messages": MESSAGES, "max_tokens": 1}
    async with http.post(served.at("/upstream/chat/v1/chat/completions"), json=body) as response:
        assert response.headers["X-Demo-Model"] == "b"
        assert (await response.json())["echo"]["body"]["model"] == "public"
    async with http.post(served.at("/upstream/a/v1/chat/completions"), json=body) as response:
        assert response.status == 404


async def test_the_active_profile_lists_its_pins_that_name_nothing_else(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(profiled())

    async def listed() -> dict[str, Any]:
        async with http.get(served.at("/v1/models")) as response:
            return {record["id"]: record for record in (await response.json())["data"]}

    assert "chat" not in await listed()
    await put_active(http, served, {"name": "work"})
    records = await listed()
    assert records["chat"]["meta"]["llamaswap"] == {"type": "profile"}
    assert records["chat"]["status"] == {"value": "unloaded"}
    assert "pick" in records
    assert records["a"]["meta"]["llamaswap"]["type"] == "model"  # a disabled pin leaves the model listed


async def test_a_real_switch_publishes_one_event_and_a_reload_resets_to_none(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(profiled())
    subscription = served.services.events.bus.subscribe()
    await put_active(http, served, {"name": "work"})
    await put_active(http, served, {"name": "work"})  # already active: no event
    await put_active(http, served, {"name": ""})
    events = []
    while (item := subscription.take()) is not None:
        if isinstance(item, Event) and item.type in ("profileChanged", "modelStatus"):
            events.append((item.type, dict(item.data) if item.type == "profileChanged" else None))
    # llama-swap's order: each real switch sends profileChanged, then modelStatus.
    assert events == [("profileChanged", {"active": "work"}), ("modelStatus", None),
                      ("profileChanged", {"active": None}), ("modelStatus", None)]
    await put_active(http, served, {"name": "home"})
    apply_config(served.state, profiled())
    async with http.get(served.at("/api/profiles")) as response:
        assert (await response.json())["active"] is None
