"""`GET /v1/realtime?model=...`: OpenAI's Realtime API, a websocket, routed by its `model` query parameter.

Servers that speak it locally (vLLM's realtime transcription, speaches) get it through the same websocket
relay as `/upstream/<model>/...` (`upstream.relay_socket`): the socket may start its model and holds it in
flight until it closes, unless the model sets `compat.ignoreWebsockets`. Aliases resolve and the query's
`model` is rewritten to the name the upstream knows (`useModelName`, a peer's own name for it). Profile
pins and selectors apply first, as on the other model routes; a selector's count holds while the socket is
open (a model that ignores websockets is counted only for the choice).
"""

from __future__ import annotations

from aiohttp import web

from llmswap.server.http.errors import error_response
from llmswap.server.http.middleware import request_record
from llmswap.server.inference.passthrough import UpstreamTarget, relay_socket
from llmswap.server.inference.peers import resolve_peer
from llmswap.server.inference.profiles import PROFILES
from llmswap.server.inference.resolve import no_model_message, unknown_model_message
from llmswap.server.inference.routes import query_with_model
from llmswap.server.inference.selectors import SELECTORS, NoTarget, SelectorHold
from llmswap.server.inference.websocket import is_upgrade
from llmswap.server.state import state

PATH = "/v1/realtime"


def setup(app: web.Application) -> None:
    app.router.add_get(PATH, realtime)


async def realtime(request: web.Request) -> web.StreamResponse:
    if not is_upgrade(request):
        return error_response(request, 400, f"{PATH} is a websocket: connect with a websocket client "
                              "(Upgrade: websocket)")
    asked = name = request.query.get("model", "")
    if not name:
        return error_response(request, 400, f"{PATH} needs the model as a query parameter: {PATH}?model=<id>")
    server = state(request)
    config = server.config
    pinned = request.app[PROFILES].active.pins.get(name)
    if pinned == "":
        return error_response(request, 404, no_model_message(config, name))
    name = pinned or name
    lease: SelectorHold | None = None
    selector = config.selectors.get(name)
    if selector is not None:
        try:
            lease = request.app[SELECTORS].book(config).pick(server.router, selector)
        except NoTarget as exc:
            return error_response(request, 503, str(exc))
        name = lease.target
    try:
        return await _relay(request, name, asked, lease)
    finally:
        if lease is not None:
            lease.release()


async def _relay(request: web.Request, name: str, asked: str, lease: SelectorHold | None
                 ) -> web.StreamResponse:
    config = state(request).config
    model_id = config.real_model_name(name)
    if model_id is not None:
        sent = config.models[model_id].use_model_name or name
        target = UpstreamTarget(name, model_id, None, PATH)
        if lease is not None and config.models[model_id].ignore_websockets:
            lease.release()  # the socket will not hold its model: it does not hold the selector's count
    else:
        served = resolve_peer(config, name)
        if served is None:
            return error_response(request, 404, unknown_model_message(config, name))
        sent = served[1]
        target = UpstreamTarget(name, served[1], served[0].id, PATH)
    query = query_with_model(request, sent) if sent != asked else request.rel_url.raw_query_string
    return await relay_socket(request, target, query, request_record(request))
