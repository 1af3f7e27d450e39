"""Which requests the front keeps (`fast_plan`): only a request the aiohttp route would send to a local
model without streaming, after the guard, the keys, the pins and the filters said so; everything else is
left to aiohttp (None). Pure: no event loop, no process."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from llmswap.config.model import ApiKey, Config
from llmswap.router import build_router
from llmswap.server import guardrails
from llmswap.server.front.request import FastPlan, FrontRequest, fast_plan
from llmswap.server.inference import ROUTES
from llmswap.server.state import API_KEY, STATE, ServerState
from tests.helpers.models import demo_config, exclusive_config

CHAT_ROUTE = next(route for route in ROUTES if route.path == "/v1/chat/completions")
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def app_for(config: Config, *, loopback_listener: bool = False) -> web.Application:
    app = web.Application()
    app[STATE] = ServerState(config=config, router=build_router(config), loopback_listener=loopback_listener)
    app[guardrails.REPORTED] = {}
    return app


def plan(app: web.Application, document: Any, **headers: str) -> tuple[FastPlan | None, FrontRequest]:
    sent = CIMultiDict({"Host": "localhost", "Content-Type": "application/json", **headers})
    request = FrontRequest("POST", CHAT_ROUTE.path, CIMultiDictProxy(sent), "127.0.0.1", app, None,
                           keep_alive=True)
    return fast_plan(request, CHAT_ROUTE, bytearray(json.dumps(document).encode())), request


def test_a_plain_chat_request_to_a_local_model_is_kept_with_its_body_untouched() -> None:
    kept, _ = plan(app_for(exclusive_config(demo_config("m"))), CHAT)
    assert kept is not None and kept.model.id == "m" and kept.requested == "m"
    assert json.loads(bytes(kept.body)) == CHAT


def test_streams_unknown_models_and_bodies_without_a_model_go_to_aiohttp() -> None:
    app = app_for(exclusive_config(demo_config("m")))
    assert plan(app, {**CHAT, "stream": True})[0] is None
    assert plan(app, {**CHAT, "model": "other"})[0] is None
    assert plan(app, {"messages": []})[0] is None
    assert plan(app, ["not", "an", "object"])[0] is None


def test_refusals_go_to_aiohttp_to_be_answered_there() -> None:
    keyed = app_for(exclusive_config(demo_config("m"), api_keys=(ApiKey("sk-right-000000"),)))
    assert plan(keyed, CHAT)[0] is None
    assert plan(keyed, CHAT, Authorization="Bearer sk-wrong-00000")[0] is None
    guarded = app_for(exclusive_config(demo_config("m")), loopback_listener=True)
    assert plan(guarded, CHAT, Host="evil.test")[0] is None
    assert plan(guarded, CHAT, Origin="http://evil.test")[0] is None
    assert plan(guarded, CHAT, **{"X-Priority": "high"})[0] is None  # aiohttp answers the 400
    small = app_for(exclusive_config(demo_config("m"), max_request_body=10))
    assert plan(small, CHAT)[0] is None  # aiohttp answers the 413


def test_a_right_key_is_kept_for_the_request_and_removed_from_what_goes_on() -> None:
    key = ApiKey("sk-right-000000", priority=5)
    kept, request = plan(app_for(exclusive_config(demo_config("m"), api_keys=(key,))), CHAT,
                         Authorization="Bearer sk-right-000000")
    assert kept is not None and kept.key == key
    assert (kept.asking.priority, kept.asking.api_key) == (5, key.key)
    assert request[API_KEY] == key and "Authorization" not in request.headers


def test_an_allowed_page_origin_is_kept_for_the_cors_answer() -> None:
    kept, request = plan(app_for(exclusive_config(demo_config("m"))), CHAT, Origin="http://localhost:5173")
    assert kept is not None
    assert "http://localhost:5173" in request.values()


def test_aliases_and_use_model_name_apply_as_on_the_aiohttp_route() -> None:
    model = dataclasses.replace(demo_config("m"), aliases=("gpt",), use_model_name="served-name")
    config = exclusive_config(model)
    config = dataclasses.replace(config, aliases={"gpt": "m"})
    kept, _ = plan(app_for(config), {**CHAT, "model": "gpt"})
    assert kept is not None and kept.model.id == "m" and kept.requested == "gpt"
    assert json.loads(bytes(kept.body))["model"] == "served-name"
