"""`/upstream/<model>/<path>`: talk to one model's own server (its web UI, `/props`, `/metrics`...) directly.

The model is the longest leading run of path segments that names a model id, an alias or a peer model
(names may contain `/`). The rest of the path, escaping intact, the query and the body go to the upstream
untouched: no filters, no `useModelName`. A local model is reached through the router like any request, so
it is started (and others swapped out) when needed, except for paths matching `upstream.ignorePaths` (a
browser fetching a page's assets must not trigger a swap): those get 409 while the model is not ready.

A websocket upgrade is relayed too (`websocket.py`). Like llama-swap, llmswap counts an open socket as a
request in flight: it may start the model, and holds it loaded (no eviction, no ttl) until it closes. A
model with `compat.ignoreWebsockets` (ComfyUI, whose page keeps a progress socket open for as long as the
tab is) does not count its sockets: they cannot start it (409 while it is not ready), do not keep it loaded,
and are closed when it stops.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote

from aiohttp import web

from llmswap.activity.recording import Recording, RequestRecord
from llmswap.config.model import Config, ModelConfig
from llmswap.process.state import ProcessState
from llmswap.scheduler.errors import SchedulerError
from llmswap.server.http.connections import cancel_on_hangup, keep_on_hangup
from llmswap.server.http.errors import error_response, scheduler_error_response
from llmswap.server.http.middleware import request_record, too_large_message
from llmswap.server.inference import proxy, websocket
from llmswap.server.inference.inflight import begin_http, served
from llmswap.server.inference.peers import forward_to_peer, peer_headers, resolve_peer
from llmswap.server.inference.profiles import PROFILES
from llmswap.server.inference.proxy import DISPATCHER, UPSTREAMS
from llmswap.server.inference.resolve import MalformedRequest
from llmswap.server.inference.routes import (
    ROUTES,
    BodyTooLarge,
    read_body,
    request_priority,
)
from llmswap.server.state import request_options, state

PREFIX = "/upstream/"
MODEL_ROUTES = frozenset((route.method, route.path) for route in ROUTES)


def setup(app: web.Application) -> None:
    app.router.add_get("/upstream", models_page)
    app.router.add_route("*", "/upstream/{tail:.*}", to_upstream)
    app.on_shutdown.append(websocket.close_open_sockets)


@dataclass(frozen=True)
class UpstreamTarget:
    """What an `/upstream/...` path addresses."""

    raw_name: str  # the model name as written in the URL, escaping kept (for the redirect)
    model: str  # the real model id; for a peer, the peer's own name for the model
    peer: str | None  # the peer serving it, None for a local model
    path: str  # what follows the name, escaping kept: "" when nothing (not even "/") follows


def find_target(config: Config, raw_tail: str) -> UpstreamTarget | None:
    """Resolve the part of the path after `/upstream/`: the longest leading segments naming a model."""
    segments = raw_tail.split("/")
    for end in range(len(segments), 0, -1):
        raw_name = "/".join(segments[:end])
        name = unquote(raw_name)
        if not name:
            continue
        rest = segments[end:]
        path = "/" + "/".join(rest) if rest else ""
        model_id = config.real_model_name(name)
        if model_id is not None:
            return UpstreamTarget(raw_name, model_id, None, path)
        served = resolve_peer(config, name)
        if served is not None:
            return UpstreamTarget(raw_name, served[1], served[0].id, path)
    return None


def pinned_tail(pin: Callable[[str], str | None], raw_tail: str) -> str | None:
    """The path after `/upstream/` with the longest pinned leading name replaced by its target (the
    rest keeps its escaping); None when that pin disables the name."""
    segments = raw_tail.split("/")
    for end in range(len(segments), 0, -1):
        target = pin(unquote("/".join(segments[:end])))
        if target is None:
            continue
        if not target:
            return None
        return "/".join([quote(target, safe="/"), *segments[end:]])
    return raw_tail


def ignored(path: str, patterns: Sequence[str]) -> bool:
    """Whether `upstream.ignorePaths` covers this path (each pattern may match anywhere in it)."""
    return any(re.search(pattern, path) for pattern in patterns)


async def models_page(request: web.Request) -> web.Response:
    raise web.HTTPFound("/ui/models")


async def to_upstream(request: web.Request) -> web.StreamResponse:
    record = request_record(request)  # handed down from here
    server = state(request)
    raw_tail = request.rel_url.raw_path[len(PREFIX):]
    pinned = pinned_tail(request.app[PROFILES].active.pins.get, raw_tail)
    if pinned is None:
        return error_response(request, 404, "model not found: the active profile disables this name")
    target = find_target(server.config, pinned)
    if target is None:
        return error_response(
            request, 404, f"model not found: /upstream/{unquote(raw_tail)} names no model id, alias or peer "
            "model of this config; use /upstream/<model>/<path>",
        )
    if target.path == "":
        # Relative links in the upstream's pages only resolve under the trailing-slash form.
        location = f"{PREFIX}{target.raw_name}/"
        if request.rel_url.raw_query_string:
            location += "?" + request.rel_url.raw_query_string
        if request.method in ("GET", "HEAD"):
            raise web.HTTPMovedPermanently(location)
        raise web.HTTPPermanentRedirect(location)
    if target.peer is None:
        refusal = _refuse_while_down(request, target.model, target.path) or _refuse_sleep_calls(
            request, server.config.models[target.model], target.path)
        if refusal is not None:
            return refusal
    if websocket.is_upgrade(request):
        return await relay_socket(request, target, request.rel_url.raw_query_string, record)
    limit = server.config.max_request_body
    try:
        # The whole body, size-checked against the live limit before anything queues: an oversized
        # upload never starts a model.
        raw = await read_body(request, limit)
        priority = request_priority(request)
    except BodyTooLarge:
        return error_response(request, 413, too_large_message(limit))
    except MalformedRequest as exc:
        return error_response(request, 400, exc.message)
    body = raw if request.body_exists else None
    record.model = name = target.model if target.peer is None else f"{target.peer}/{target.model}"
    # An in-flight entry when the path is itself a model route (as llama-swap tracks them), shown by the
    # path after the model; nothing for the upstream's other pages. Such a route is recorded in activity
    # too (POSTs, as llama-swap records them).
    path = unquote(target.path)
    tracked = (request.method, path) in MODEL_ROUTES
    recording = None
    if tracked and request.method == "POST":
        recording = begin_http(request, record, model=name, requested=name, req_path=path)
    if target.peer is not None:
        peer = server.config.peers[target.peer]
        # The body goes as the client sent it: no model rewrite, no filters (unlike the inference routes).
        work = forward_to_peer(request, peer, path=target.path, body=body, recording=recording, record=record)
    else:
        work = _to_model(request, record, target.model, target.path, body, priority, recording)
    return await served(request, work, record, model=name if tracked else None, path=path,
                        recording=recording)


def _refuse_sleep_calls(request: web.Request, model: ModelConfig, path: str) -> web.Response | None:
    """The 403 for a model's own `sleep:`/`wake:` paths: only llmswap puts it to sleep and wakes it (a
    client doing so would leave llmswap believing a sleeping server ready, or the other way round)."""
    owned = {call[1].partition("?")[0] for call in (model.sleep_call, model.wake_call) if call is not None}
    if unquote(path).partition("?")[0] in owned:
        return error_response(request, 403, f"{unquote(path)} of model {model.id} is llmswap's to call: it "
                                            "puts the model to sleep and wakes it (sleep: and wake:)")
    return None


def _refuse_while_down(request: web.Request, model_id: str, path: str) -> web.Response | None:
    """The 409 for a path in `upstream.ignorePaths` while the model is not ready (it must not start it)."""
    server = state(request)
    process = server.router.processes.get(model_id)
    current = process.state if process is not None else ProcessState.STOPPED
    if current is not ProcessState.READY and ignored(path, server.config.upstream_ignore_paths):
        return error_response(
            request, 409, f"model {model_id} is not loaded; path matches upstream.ignorePaths",
        )
    return None


async def relay_socket(request: web.Request, target: UpstreamTarget, query: str,
                       record: RequestRecord) -> web.StreamResponse:
    """Relay a websocket upgrade to `target` (`query` is the raw query string to send), holding the model
    in flight for as long as the socket is open unless it sets `compat.ignoreWebsockets`; `record` is the
    request's."""
    server = state(request)
    pool = request.app[UPSTREAMS]
    if target.peer is not None:
        record.model = f"{target.peer}/{target.model}"
        peer = server.config.peers[target.peer]
        extra, drop = peer_headers(peer, request.headers, llmswap_has_keys=bool(server.config.api_keys))
        url = proxy.upstream_url(peer.proxy, target.path, query)
        session = pool.websocket_session(f"peer:{peer.id}", peer.timeouts)
        return await websocket.relay(
            request, record, url, session, model=f"{target.peer}/{target.model}", extra_headers=extra,
            drop_headers=drop, error_prefix="peer proxy error",
        )
    record.model = target.model
    config = server.config.models[target.model]
    url = proxy.upstream_url(config.proxy, target.path, query)
    if config.ignore_websockets:
        # Not the router's business: the socket neither starts the model nor counts as in flight.
        process = server.router.processes.get(target.model)
        if process is None or process.state is not ProcessState.READY:
            return error_response(
                request, 409,
                f"model {target.model} is not loaded; ignored websocket requests cannot start it",
            )
        session = pool.websocket_session(target.model, config.timeouts)
        return await websocket.relay(request, record, url, session, model=target.model)
    try:
        priority = request_priority(request)
    except MalformedRequest as exc:
        return error_response(request, 400, exc.message)
    try:
        cancel_on_hangup(request)  # a client that hangs up while its request waits leaves the queue
        asking = request_options(request, priority)
        async with request.app[DISPATCHER].lease(target.model, asking) as lease:
            keep_on_hangup(request)  # the relay passes a client's close on to the upstream itself
            # The grant's config, not the one read above: a reload may have changed the model meanwhile.
            url = proxy.upstream_url(lease.config.proxy, target.path, query)
            session = pool.websocket_session(target.model, lease.config.timeouts)
            return await websocket.relay(request, record, url, session, model=target.model)
    except SchedulerError as err:
        return scheduler_error_response(request, err)


async def _to_model(
    request: web.Request, record: RequestRecord, model_id: str, path: str, body: bytearray | None,
    priority: int, recording: Recording | None = None,
) -> web.StreamResponse:
    try:
        # A client that hangs up while its request waits cancels the handler: it leaves the queue.
        asking = request_options(request, priority, on_granted=record.loaded)
        async with request.app[DISPATCHER].lease(model_id, asking) as lease:
            record.waited = lease.waited
            return await proxy.forward(request, lease.destination, path=path, body=body, recording=recording,
                                       record=record)
    except SchedulerError as err:
        return scheduler_error_response(request, err)
