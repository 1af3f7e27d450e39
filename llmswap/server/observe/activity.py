"""The activity routes and the recorder's place in the app.

Owns the app's `ActivityRecorder` (made from the config; a reload changes its bounds in place; the store
opens at startup, off the event loop), what an HTTP request tells it (`begin_http`, `finish_http`) and the
routes (the `activity` event after each stored row is the event feed's): `GET /api/metrics/activity`,
`GET /api/metrics/stats`, `GET /api/captures/{id}` (llama-swap's shapes and error texts).
"""

from __future__ import annotations

import logging

from aiohttp import web

from llmswap.activity.query import QueryError, parse_query
from llmswap.activity.recorder import ActivityRecorder, ActivitySettings
from llmswap.activity.recording import Recording, RequestFacts, RequestRecord
from llmswap.activity.store import open_store
from llmswap.config.model import ApiKey, Config
from llmswap.server.http.errors import error_response
from llmswap.server.http.middleware import CLIENT_GONE
from llmswap.server.state import API_KEY, STATE, state

log = logging.getLogger("llmswap.activity")

RECORDER: web.AppKey[ActivityRecorder] = web.AppKey("llmswap_recorder", ActivityRecorder)


def settings_of(config: Config) -> ActivitySettings:
    wanted = config.activity
    return ActivitySettings(max_in_memory=wanted.max_in_memory, capture_mb=wanted.capture_mb)


def key_name(request: web.Request) -> str:
    """Which configured key the request used, as `apiKeys[<index>]`: never the key itself."""
    key = request.get(API_KEY)
    return "" if key is None else _key_name(state(request).config.api_keys, key)


def _key_name(keys: tuple[ApiKey, ...], key: object) -> str:
    for index, candidate in enumerate(keys):
        if candidate is key:  # the usual case: auth found it in this config
            return f"apiKeys[{index}]"
    for index, candidate in enumerate(keys):  # found in the config before a reload
        if candidate == key:
            return f"apiKeys[{index}]"
    return ""


def begin_http(request: web.Request, record: RequestRecord, *, model: str, requested: str,
               req_path: str) -> Recording:
    """The activity recording of `request`, whose wait and swap phases it reads from its `record`."""
    server_state = request.app[STATE]
    key = request.get(API_KEY)
    name = "" if key is None else _key_name(server_state.config.api_keys, key)
    # positional (cheaper): model, req_path, requested_model, origin, key_name, method, request_headers
    facts = RequestFacts(model, req_path, requested, "http", name, request.method, request.headers)
    return request.app[RECORDER].begin(facts, record)


def finish_http(recording: Recording, response: web.StreamResponse | None) -> None:
    """End `recording` with what was answered: the upstream's answer it saw pass, else the response
    llmswap made itself, else (no response: the handler was cancelled) the client's leaving. Its row and
    capture are kept with the recorder's next batch (`finish_soon`): the routes below settle it first."""
    try:
        if recording.answered:
            recording.finish_soon()
        elif response is None:
            recording.finish_soon(CLIENT_GONE, error="the client went away before the answer")
        elif isinstance(response, web.Response):
            body = response.body if isinstance(response.body, bytes) else None
            recording.finish_soon(response.status, content_type=response.content_type, body=body)
        else:
            recording.finish_soon(response.status, content_type=response.content_type)
    except Exception:
        log.exception("activity: recording a request failed")


# -------------------------------------------------------------------------------- routes


async def activity(request: web.Request) -> web.Response:
    try:
        query = parse_query({name: request.query.getall(name) for name in request.query})
    except QueryError as exc:
        return error_response(request, 400, str(exc))
    recorder = request.app[RECORDER]
    recorder.settle()
    try:
        page = await recorder.log.page(query)
    except Exception:
        log.exception("activity: reading activity failed")
        return error_response(request, 500, "failed to get activity")
    return web.json_response(page.as_dict(recorder.has_capture))


async def stats(request: web.Request) -> web.Response:
    model = request.query.get("model", "").strip() or None
    recorder = request.app[RECORDER]
    recorder.settle()
    try:
        body = await recorder.log.stats(model)
    except Exception:
        log.exception("activity: reading activity stats failed")
        return error_response(request, 500, "failed to get activity stats")
    return web.json_response(body)


async def capture(request: web.Request) -> web.Response:
    try:
        activity_id = int(request.match_info["id"])
    except ValueError:
        return error_response(request, 400, "invalid capture ID")
    recorder = request.app[RECORDER]
    recorder.settle()
    found = recorder.captures.get(activity_id)
    if found is None:
        return error_response(request, 404, "capture not found")
    return web.json_response(found.as_dict())


# -------------------------------------------------------------------------------- wiring


def setup(app: web.Application) -> None:
    app.router.add_get("/api/metrics/activity", activity)
    app.router.add_get("/api/metrics/stats", stats)
    app.router.add_get("/api/captures/{id}", capture)
    app.on_startup.append(_open_store)
    app.on_cleanup.append(_close_store)


async def _open_store(app: web.Application) -> None:
    server_state = app[STATE]
    activity_config = server_state.config.activity
    if activity_config.store_path is None:
        return
    recorder = app[RECORDER]
    store = await open_store(activity_config.store_path, activity_config.store_retention)
    if store is not None:
        recorder.use_log(store, first_id=store.next_id)


async def _close_store(app: web.Application) -> None:
    await app[RECORDER].close()
