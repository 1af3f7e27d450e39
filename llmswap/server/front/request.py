"""Which requests the front serves itself, decided from the request alone (no I/O, nothing changed).

`fast_plan` asks the owners of each rule, in the order the aiohttp path applies them — the guard
(`guard.judge`), the API keys (`auth`), the body limit, what the body names (`resolve.identify`), the
X-Priority and X-Deadline-Ms headers, the active profile's pin, selectors, aliases, the context
guardrail and the model's filters (`inference.outgoing_body`) — and answers either a `FastPlan` or None.
None means: hand the request to aiohttp, which then answers it exactly as it answers any request (a
refusal included). So the front never has to render a refusal of its own: every request it keeps is one
that goes to a local model.

`FrontRequest` is the neutral view of one request the owners' helpers read (`headers`, `method`,
`path`, `remote`, `app`, and the per-request values they keep under their `web.RequestKey`s), in place
of an `aiohttp.web.Request` the fast path never builds.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from aiohttp import hdrs, web
from multidict import CIMultiDict, CIMultiDictProxy, MultiDict, MultiDictProxy

from llmswap.config.model import ApiKey, Config, ModelConfig
from llmswap.dispatch.filters import local_plan
from llmswap.dispatch.pool import Body
from llmswap.router import AcquireOptions, BaseRouter
from llmswap.server import auth, guard, guardrails
from llmswap.server.inference import InferenceRoute, outgoing_body, request_deadline_ms, request_priority
from llmswap.server.profiles import active_profile
from llmswap.server.resolve import Identified, MalformedRequest, identify, renamed
from llmswap.server.state import API_KEY, STATE, ServerState

EMPTY_QUERY: MultiDictProxy[str] = MultiDictProxy(MultiDict())


class FrontRequest(dict[Any, Any]):
    """One request the front read, as the owners' helpers see it. The mapping holds what they keep per
    request under their keys (the access record, the in-flight entry, the API key)."""

    __slots__ = (
        "app",
        "headers",
        "keep_alive",
        "method",
        "path",
        "remote",
        "started",
        "transport",
    )

    def __init__(self, method: str, path: str, headers: CIMultiDictProxy[str], remote: str | None,
                 app: web.Application, transport: Any, keep_alive: bool) -> None:
        super().__init__()
        self.method = method
        self.path = path
        self.headers = headers
        self.remote = remote
        self.app = app
        self.transport = transport
        self.started = time.monotonic()
        self.keep_alive = keep_alive

    @property
    def query(self) -> MultiDictProxy[str]:
        return EMPTY_QUERY  # a request with a query string is never served by the front

    def __hash__(self) -> int:  # observers may keep requests in sets or dicts, as with web.Request
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other


class FastPlan(NamedTuple):
    """A request the front serves: everything the aiohttp route would have decided before waiting.
    (A named tuple: immutable, and made per request for a fraction of a frozen dataclass's cost.)"""

    route: InferenceRoute
    state: ServerState
    config: Config
    router: BaseRouter  # read together with `config`: a reload meanwhile must not pair one with another
    model: ModelConfig
    requested: str  # as the client named it, before a profile pin
    found: Identified
    body: Body  # after the model's filters
    key: ApiKey | None
    asking: AcquireOptions  # what the lease asks for: priority, key, deadline (the model's by default)


def fast_plan(request: FrontRequest, route: InferenceRoute, raw: bytearray) -> FastPlan | None:
    """The plan for serving `request` on the front, or None when aiohttp must answer it (a refusal, an
    error, a stream, anything that is not a local model)."""
    server: ServerState = request.app[STATE]
    config, router = server.config, server.router
    verdict = guard.judge(request.method, request.path, request.headers, config,
                          loopback_listener=server.loopback_listener)
    if verdict.refused:
        return None
    if verdict.allow_origin:
        request[guard.ALLOWED_ORIGIN] = verdict.allow_origin  # the response hooks echo it back
    key = _admitted_key(request, config)
    if config.api_keys and key is None:
        return None
    if len(raw) > config.max_request_body:
        return None
    try:
        found = identify(request.method, request.headers.get(hdrs.CONTENT_TYPE, ""), raw, EMPTY_QUERY)
        priority = request_priority(request)  # type: ignore[arg-type]  # reads headers and the key only
        deadline_ms = request_deadline_ms(request)  # type: ignore[arg-type]
    except MalformedRequest:
        return None
    if found.source != "json" or found.streaming or not found.model:
        return None
    requested = found.model
    pinned = active_profile(server).pin(found.model)
    if pinned is not None:
        found, raw = renamed(found, raw, pinned)
    if found.model in config.selectors:
        return None
    real = config.real_model_name(found.model)
    if real is None:
        return None  # a peer's model, or none: the aiohttp route knows both
    model = config.models[real]
    if guardrails.over_context(request.app, model, found.document) is not None:
        return None
    body = outgoing_body(raw, found, local_plan(model, found.model))
    asking = AcquireOptions(priority=priority, api_key=key.key if key is not None else None,
                            deadline_ms=deadline_ms or model.deadline_ms or None)
    return FastPlan(route, server, config, router, model, requested, found, body, key, asking)


def _admitted_key(request: FrontRequest, config: Config) -> ApiKey | None:
    """The API key the request is let in with (kept where the helpers look for it, its credentials removed
    from the headers that go on), or None when keys are off or it presents none that matches."""
    if not config.api_keys or auth.is_open(request.method, request.path):
        return None
    _, key = auth.presented_key(request.headers, config.api_keys)
    if key is not None:
        request.headers = CIMultiDictProxy(auth.without_credentials(request.headers))
        request[API_KEY] = key
    return key


def header_multidict(pairs: list[tuple[str, str]]) -> CIMultiDictProxy[str]:
    """Header pairs as aiohttp holds them."""
    return CIMultiDictProxy(CIMultiDict(pairs))


def route_table(routes: tuple[InferenceRoute, ...]) -> Mapping[str, InferenceRoute]:
    """The POST inference routes, by the path clients call."""
    return {route.path: route for route in routes if route.method == "POST"}
