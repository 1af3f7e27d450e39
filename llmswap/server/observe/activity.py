"""The activity routes and the recorder's place in the app.

Owns the app's `ActivityRecorder` (made from the config; a reload changes its bounds in place; the store
opens at startup, off the event loop) and the routes: `GET /api/metrics/activity`, `GET /api/metrics/stats`,
`GET /api/captures/{id}` (llama-swap's shapes and error texts). What an HTTP request tells the recorder is
the in-flight frame's (`llmswap.server.inference.inflight`); the `activity` event after each row, the event
feed's.
"""

from __future__ import annotations

import logging

from aiohttp import web

from llmswap.activity.query import QueryError, parse_query
from llmswap.activity.recorder import ActivityRecorder, ActivitySettings
from llmswap.activity.store import open_store
from llmswap.config.model import Config
from llmswap.server.http.errors import error_response
from llmswap.server.state import STATE

log = logging.getLogger("llmswap.activity")

RECORDER: web.AppKey[ActivityRecorder] = web.AppKey("llmswap_recorder", ActivityRecorder)


def settings_of(config: Config) -> ActivitySettings:
    wanted = config.activity
    return ActivitySettings(max_in_memory=wanted.max_in_memory, capture_mb=wanted.capture_mb)


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
