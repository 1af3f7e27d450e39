"""The model-routed inference routes (reference 5.2): read the body, find the model, rewrite the body for
the upstream, wait for the model (with loading feedback when asked), then stream the upstream's answer.

A request goes to a local model (by id or alias) when one matches, else to a peer, else it is a 404. The
request runs in `inflight.served` (its in-flight entry, cancel and activity recording), which has the
handler cancelled when its client hangs up (`connections.cancel_on_hangup`): a client that hangs up while
queued leaves the queue (the router never starts a model for it), one that hangs up mid-stream closes the
upstream request.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlencode

from aiohttp import hdrs, web

from llmswap.activity.recording import Recording, RequestRecord
from llmswap.config.model import ModelConfig, PeerConfig
from llmswap.process.state import ProcessState
from llmswap.router import Router
from llmswap.router.types import ordered_phases
from llmswap.scheduler.errors import Preempted, SchedulerError
from llmswap.server.http import middleware
from llmswap.server.http.errors import error_response, scheduler_error_response
from llmswap.server.http.middleware import request_record
from llmswap.server.inference import guardrails
from llmswap.server.inference.inflight import begin_http, served
from llmswap.server.inference.loading import LoadingFeedback, StreamDialect, dialect_for
from llmswap.server.inference.peer_watch import PEER_WATCH, discovered_for, placement_for
from llmswap.server.inference.peers import forward_to_peer, resolve_peer
from llmswap.server.inference.profiles import PROFILES
from llmswap.server.inference.proxy import (
    CLIENT_CLOSED_REQUEST,
    DISPATCHER,
    Body,
    close_upstream_pool,
    forward,
)
from llmswap.server.inference.resolve import (
    Identified,
    MalformedRequest,
    encode_form_value,
    identify,
    no_model_message,
    renamed,
    unknown_model_message,
)
from llmswap.server.inference.selectors import SELECTORS, NoTarget, SelectorHold
from llmswap.server.state import request_api_key, request_options, state
from llmswap.upstream.filters import FilterPlan, apply_plan, local_plan, plan_for

PRIORITY_HEADER = "X-Priority"
DEADLINE_HEADER = "X-Deadline-Ms"  # milliseconds after arrival by which the request should be served


@dataclass(frozen=True)
class InferenceRoute:
    method: str
    path: str  # as clients call it
    upstream_path: str  # as the upstream receives it


def _same(method: str, *paths: str) -> list[InferenceRoute]:
    return [InferenceRoute(method, path, path) for path in paths]


# llama-swap's model routes. `/v/...` and `/audioapi/...` drop their prefix on the way to the upstream.
ROUTES: tuple[InferenceRoute, ...] = (
    *_same(
        "POST",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/completions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/embeddings",
        "/reranking",
        "/rerank",
        "/v1/rerank",
        "/v1/reranking",
        "/infill",
        "/completion",
        "/v1/audio/speech",
        "/v1/audio/voices",
        "/v1/audio/transcriptions",
        "/v1/images/generations",
        "/v1/images/edits",
        "/sdapi/v1/txt2img",
        "/sdapi/v1/img2img",
    ),
    *(
        InferenceRoute("POST", f"/v{rest}", rest)
        for rest in (
            "/chat/completions",
            "/responses",
            "/completions",
            "/messages",
            "/messages/count_tokens",
            "/embeddings",
            "/rerank",
            "/reranking",
        )
    ),
    InferenceRoute("POST", "/audioapi/v1/tasks/run", "/v1/tasks/run"),
    *_same("GET", "/v1/audio/voices", "/sdapi/v1/loras", "/props"),
)


def setup(app: web.Application) -> None:
    for route in ROUTES:
        app.router.add_route(route.method, route.path, _handler(route))
    app.on_cleanup.append(close_upstream_pool)
    app[guardrails.REPORTED] = {}


def _handler(route: InferenceRoute) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    dialect = dialect_for(route.path)

    async def handle(request: web.Request) -> web.StreamResponse:
        return await serve(request, route, dialect)

    handle.__name__ = f"proxy {route.path}"
    return handle


def _client_left() -> web.StreamResponse:
    return web.Response(status=CLIENT_CLOSED_REQUEST)


# -------------------------------------------------------------------------------- one request


class BodyTooLarge(Exception):
    pass


async def read_body(request: web.Request, limit: int) -> bytearray:
    """The whole request body, refusing to hold more than `limit` bytes (the live config's limit, which a
    reload may change, so aiohttp's fixed `client_max_size` is not what decides)."""
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge
    body = bytearray()
    if not request.body_exists:
        return body
    async for chunk in request.content.iter_any():
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge
    return body


def request_priority(request: web.Request) -> int:
    """`X-Priority` when the client sent one, else its API key's default priority, else 0."""
    header = request.headers.get(PRIORITY_HEADER, "").strip()
    if header:
        try:
            return int(header)
        except ValueError:
            raise MalformedRequest(
                f"{PRIORITY_HEADER} must be an integer (higher is served first), got {header!r}"
            ) from None
    key = request_api_key(request)
    return key.priority if key is not None else 0


def request_deadline_ms(request: web.Request) -> float | None:
    """`X-Deadline-Ms` when the client sent one, else its API key's `deadlineMs`; None for neither
    (the model's `deadlineMs` applies then)."""
    header = request.headers.get(DEADLINE_HEADER, "").strip()
    if header:
        try:
            value = float(header)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value <= 0:
            raise MalformedRequest(
                f"{DEADLINE_HEADER} must be a positive number of milliseconds after arrival, got {header!r}"
            )
        return value
    key = request_api_key(request)
    return key.deadline_ms if key is not None and key.deadline_ms > 0 else None


@dataclass(frozen=True)
class InferenceRequest:
    """One request as read: the route it came by, its body and what the body names."""

    route: InferenceRoute
    found: Identified
    raw: bytearray
    priority: int
    dialect: StreamDialect
    query: str | None = None  # the query string to forward instead of the client's (model renamed there)
    deadline_ms: float | None = None  # header or API key; the model's default is applied when served


async def serve(request: web.Request, route: InferenceRoute, dialect: StreamDialect) -> web.StreamResponse:
    record = request_record(request)  # handed down from here: each fact is written where it is known
    server = state(request)
    # Read once, together: a reload while this request waits must not pair one config with another router.
    config, router = server.config, server.router
    try:
        raw = await read_body(request, config.max_request_body)
    except ConnectionError:  # the client left while sending its body
        return _client_left()
    except BodyTooLarge:
        return error_response(request, 413, middleware.too_large_message(config.max_request_body))
    try:
        found = identify(request.method, request.headers.get(hdrs.CONTENT_TYPE, ""), raw, request.query)
        priority = request_priority(request)
        deadline_ms = request_deadline_ms(request)
    except MalformedRequest as exc:
        return error_response(request, 400, exc.message)
    # Profile pins, then selectors, rename the model where the client put it: what follows (aliases,
    # filters, useModelName, peers, the router) sees the new name as if the client had sent it.
    asked_for = found.model
    pinned = request.app[PROFILES].active.pins.get(found.model) if found.model else None
    if pinned is not None:
        found, raw = renamed(found, raw, pinned)
    if not found.model:
        return error_response(request, 404, no_model_message(config, asked_for if pinned == "" else ""))
    lease: SelectorHold | None = None
    selector = config.selectors.get(found.model)
    if selector is not None:
        try:
            lease = request.app[SELECTORS].book(config).pick(router, selector)
        except NoTarget as exc:
            return error_response(request, 503, str(exc))
        found, raw = renamed(found, raw, lease.target)
    renamed_query = found.source == "query" and found.model != asked_for
    query = query_with_model(request, found.model) if renamed_query else None
    incoming = InferenceRequest(route, found, raw, priority, dialect, query, deadline_ms)
    try:
        real = config.real_model_name(found.model)
        if real is not None:
            placed = placement_for(request, real) if config.peers else None  # only peers place elsewhere
            if placed is not None:
                record.placed = placed.reason
            if placed is not None and placed.host:  # another llmswap serves it better (placement.py)
                name = f"{placed.host}/{real}"
                recording = _recorded(request, record, name, asked_for, route)
                peer_config = config.peers[placed.host]
                work = _serve_peer(request, record, peer_config, real, incoming, recording, forwarded=True)
                return await served(request, work, record, model=name, recording=recording,
                                    sse_error=incoming.dialect.error)
            recording = _recorded(request, record, real, asked_for, route)
            work = _serve_local(request, record, router, config.models[real], incoming, recording)
            return await served(request, work, record, model=real, recording=recording,
                                sse_error=incoming.dialect.error)
        peer = resolve_peer(config, found.model)
        if peer is not None:
            recording = _recorded(request, record, found.model, asked_for, route)
            work = _serve_peer(request, record, peer[0], peer[1], incoming, recording)
            return await served(request, work, record, model=found.model, recording=recording,
                                sse_error=incoming.dialect.error)
        discovered = discovered_for(request, found.model)
        if discovered is not None:  # only a discover peer defines it: one hop there, marked as forwarded
            placed, bare = discovered
            record.placed = placed.reason
            name = f"{placed.host}/{bare}"
            recording = _recorded(request, record, name, asked_for, route)
            work = _serve_peer(request, record, config.peers[placed.host], bare, incoming, recording,
                               forwarded=True)
            return await served(request, work, record, model=name, recording=recording,
                                sse_error=incoming.dialect.error)
    except ConnectionResetError:
        return _client_left()
    finally:
        # A selector's count covers the request from its choice to the end of its response.
        if lease is not None:
            lease.release()
    message = unknown_model_message(config, found.model)
    down = request.app[PEER_WATCH].down_for(found.model)
    if down:
        verb = "is" if len(down) == 1 else "are"
        message += f"; {', '.join(down)} defined it but {verb} down or not answering"
    return error_response(request, 404, message)


def _recorded(request: web.Request, record: RequestRecord, model: str, asked_for: str,
              route: InferenceRoute) -> Recording:
    """`model` (the local id, or `host/model` at a peer) serves the request: its record says so, and its
    activity recording begins."""
    record.model = model
    return begin_http(request, record, model=model, requested=asked_for, req_path=route.upstream_path)


async def _serve_local(
    request: web.Request, record: RequestRecord, router: Router, model: ModelConfig,
    incoming: InferenceRequest, recording: Recording,
) -> web.StreamResponse:
    found = incoming.found
    body = outgoing_body(incoming.raw, found, local_plan(model, found.model))
    feedback: LoadingFeedback | None = None
    # What the router tells a request that may show its model loading (a stream of a model that sends its
    # loading state): its place in the queue, and that it was admitted (a loading stream begins then).
    on_position: Callable[[int], None] | None = None
    on_admitted: Callable[[ProcessState], None] | None = None
    if found.streaming and model.send_loading_state:
        position = 0

        def placed(new_position: int) -> None:
            nonlocal position
            position = new_position
            if feedback is not None:
                feedback.set_position(new_position)

        def admitted(model_state: ProcessState) -> None:
            nonlocal feedback
            if model_state is not ProcessState.READY:
                feedback = LoadingFeedback(request, model.id, found.model, incoming.dialect,
                                           position=position, progress=lambda: router.load_progress(model.id))
                feedback.start()

        on_position, on_admitted = placed, admitted

    refusal = guardrails.over_context(request.app, model, found.document)
    if refusal is not None:  # issue 16: refused before it waits, and no model is loaded for it
        return error_response(request, 400, refusal, code="context_length_exceeded", param="messages")
    try:
        asking = request_options(
            request,
            incoming.priority,
            deadline_ms=incoming.deadline_ms or model.deadline_ms or None,
            on_admitted=on_admitted,
            on_position=on_position,
            on_granted=record.loaded,  # of its wait, the seconds its model spent loading
        )
        async with request.app[DISPATCHER].lease(model.id, asking, router=router) as lease:
            record.waited = lease.waited
            if record.load:
                record.phases = tuple((p.phase, p.seconds) for p in ordered_phases(lease.phases))
            loading_response = await feedback.finish() if feedback is not None else None
            await guardrails.learn_reported_context(request.app, lease.config, lease.upstream)
            return await forward(
                request,
                lease.destination,
                path=incoming.route.upstream_path,
                body=body,
                response=loading_response,
                query=incoming.query,
                sse_error=incoming.dialect.error,
                recording=recording,
                record=record,
            )
    except SchedulerError as err:
        recording.fail(err.status, err.message)
        if feedback is not None:
            return await feedback.fail(err.status, err.message)
        if isinstance(err, Preempted) and record.answering:
            # Preempted mid-answer (its upstream call was abandoned): a truncated answer must not pass
            # for a complete one, so the connection is cut, as when an upstream breaks off.
            if request.transport is not None:
                request.transport.close()
            return _client_left()
        return scheduler_error_response(request, err)
    finally:
        if feedback is not None:
            await feedback.abandon()


async def _serve_peer(
    request: web.Request, record: RequestRecord, peer: PeerConfig, bare_model: str,
    incoming: InferenceRequest, recording: Recording, *, forwarded: bool = False,
) -> web.StreamResponse:
    found = incoming.found
    plan = plan_for(peer.filters, found.model, model=bare_model)
    return await forward_to_peer(
        request,
        peer,
        path=incoming.route.upstream_path,
        body=outgoing_body(incoming.raw, found, plan),
        query=query_with_model(request, bare_model) if found.source == "query" else None,
        sse_error=incoming.dialect.error,
        recording=recording,
        record=record,
        forwarded=forwarded,
    )


# -------------------------------------------------------------------------------- body rewriting


def outgoing_body(raw: bytearray, found: Identified, plan: FilterPlan) -> Body:
    """The body to send: the client's bytes unless the plan changes something. JSON is re-serialized only
    when a filter changed it; a form only has its `model` value spliced in, its other bytes untouched."""
    if plan.empty:
        return raw
    if found.document is not None:
        filtered, changed = apply_plan(found.document, plan)
        if not changed:
            return raw
        return json.dumps(filtered, ensure_ascii=False, separators=(",", ":")).encode()
    if plan.model is not None and found.model_span is not None and plan.model != found.model:
        span = found.model_span
        return b"".join((raw[: span.start], encode_form_value(found, plan.model), raw[span.end :]))
    return raw


def query_with_model(request: web.Request, model: str) -> str:
    pairs = [(key, model if key == "model" else value) for key, value in request.query.items()]
    return urlencode(pairs)

