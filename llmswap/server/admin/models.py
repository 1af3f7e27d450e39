"""Admin and info routes: the model list, what is running, loading and unloading, health, version, the root
redirect.

Bodies follow llama-swap's (`/v1/models` with `meta.llamaswap`, `/running`, the `OK` / `{"msg":"ok"}`
answers of the unload routes) so scripts written against it keep working; llmswap's additions are extra
keys, never renamed ones. Every handler reads the config and router from the live server state, so a
config reload is seen by the next request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from llmswap import __version__
from llmswap.config.model import Capabilities, Config, ModelConfig
from llmswap.process.state import ProcessState
from llmswap.router.types import ProcessLike
from llmswap.scheduler.errors import SchedulerError
from llmswap.scheduler.types import QueueSnapshot
from llmswap.server.http.connections import cancel_on_hangup
from llmswap.server.http.errors import error_response, scheduler_error_response
from llmswap.server.http.middleware import request_record
from llmswap.server.inference.peer_watch import PEER_WATCH
from llmswap.server.inference.peers import peer_models
from llmswap.server.inference.profiles import PROFILES, pin_records
from llmswap.server.inference.selectors import selector_records
from llmswap.server.observe.records import CAPABILITY_KEYS, plain, render_capabilities
from llmswap.server.state import request_options, state

log = logging.getLogger("llmswap.admin")

OWNER = "llmswap"


def setup(app: web.Application) -> None:
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/models", list_models)
    app.router.add_get("/running", running)
    app.router.add_get("/unload", unload_all_text)
    app.router.add_post("/api/models/unload", unload_all_json)
    app.router.add_post("/api/models/unload/{model:.+}", unload_model)
    app.router.add_post("/api/models/load/{model:.+}", load_model)
    app.router.add_get("/health", health)
    app.router.add_get("/wol-health", health)
    app.router.add_get("/", root)
    app.router.add_get("/api/version", version)


# ------------------------------------------------------------------------------------------ /v1/models


def model_records(config: Config, running: Mapping[str, ProcessState], created: int) -> list[dict[str, Any]]:
    """The `data` of `/v1/models`: listed local models (and their aliases when `includeAliasesInList`),
    then every peer model as `<peer>/<model>`, sorted by id."""
    records: list[dict[str, Any]] = []
    for model_id, model in config.models.items():
        if model.unlisted:
            continue
        status = "loaded" if model_id in running else "unloaded"
        own: dict[str, Any] = {"type": "model"}
        if model.aliases:
            own["aliases"] = list(model.aliases)
        records.append(_record(model_id, model.name, model.description, model.metadata, model.capabilities,
                               status, own, created))
        if config.include_aliases_in_list:
            for alias in model.aliases:
                if alias.strip():
                    records.append(_record(alias.strip(), model.name, model.description, model.metadata,
                                           model.capabilities, status,
                                           {"type": "alias", "modelID": model_id}, created))
    for served in peer_models(config):
        records.append(_record(served.id, f"{served.peer.id}: {served.model}", "", {}, None, "unloaded",
                               {"type": "peer", "peerID": served.peer.id}, created))
    records.sort(key=lambda record: record["id"])
    return records


def discovered_records(listed: list[dict[str, Any]], discovered: Mapping[str, list[str]],
                       created: int) -> list[dict[str, Any]]:
    """The models only `discover: true` peers define, once each (a request for one is placed among them)."""
    taken = {record["id"] for record in listed}
    return [_record(model, "", "", {}, None, "unloaded", {"type": "peer", "peerID": peers[0], "peers": peers},
                    created)
            for model, peers in discovered.items() if model not in taken]


def _record(
    model_id: str,
    name: str,
    description: str,
    metadata: Mapping[str, Any],
    capabilities: Capabilities | None,
    status: str,
    own: dict[str, Any],
    created: int,
) -> dict[str, Any]:
    record: dict[str, Any] = {"id": model_id, "object": "model", "created": created, "owned_by": OWNER}
    if name.strip():
        record["name"] = name.strip()
    if description.strip():
        record["description"] = description.strip()
    user = plain(metadata)
    if capabilities is not None:
        record.update(render_capabilities(capabilities))
        user = {key: value for key, value in user.items() if key not in CAPABILITY_KEYS}
    meta: dict[str, Any] = {"llamaswap": {**user, **own}}
    if "context_length" in record:
        meta["n_ctx"] = record["context_length"]
    record["meta"] = meta
    record["status"] = {"value": status}
    return record


async def list_models(request: web.Request) -> web.Response:
    server = state(request)
    created = int(time.time())
    records = model_records(server.config, server.router.running_models(), created)
    # Selectors, and the active profile's pins that name nothing else, are listed as llama-swap lists them.
    records += selector_records(server.config, server.router, created)
    records += pin_records(server.config, request.app[PROFILES].active.profile, created)
    records += discovered_records(records, request.app[PEER_WATCH].discovered(), created)
    records.sort(key=lambda record: record["id"])
    for record in records:
        # Router-specific facts (the vram router's footprint) ride along under llmswap's own key.
        meta = record.get("meta", {}).get("llamaswap", {})
        if meta.get("type") in ("model", "alias"):
            extras = server.router.model_extras(meta.get("modelID", record["id"]))
            if extras:
                record["meta"]["llmswap"] = extras
    # An allowed page's origin comes back on every answer (llmswap.server.http.guard), this one included.
    return web.json_response({"object": "list", "data": records})


# ------------------------------------------------------------------------------------------ /running


def running_entries(
    processes: Mapping[str, ProcessLike], snapshot: QueueSnapshot
) -> list[dict[str, Any]]:
    """`/running`: every process that is starting, ready, stopping or sleeping, sorted by model id.

    llama-swap's keys first; `pid`, `in_flight`, `waiting` and `last_start_seconds` are llmswap's.
    """
    entries: list[dict[str, Any]] = []
    for model_id in sorted(processes):
        process = processes[model_id]
        current = process.state
        if not current.is_running and current is not ProcessState.SLEEPING:
            continue
        model: ModelConfig = process.config
        last_start = process.last_start_duration
        entries.append({
            "model": model_id,
            "state": current.value,
            "cmd": model.cmd_shown,
            "proxy": model.proxy,
            "ttl": _number(model.ttl),
            "name": model.name,
            "description": model.description,
            "pid": process.pid,
            "in_flight": snapshot.in_flight.get(model_id, 0),
            "waiting": snapshot.waiting.get(model_id, 0),
            "last_start_seconds": round(last_start, 3) if last_start is not None else None,
        })
    return entries


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


async def running(request: web.Request) -> web.Response:
    router = state(request).router
    entries = running_entries(router.processes, router.snapshot())
    for entry in entries:
        entry.update(router.model_extras(entry["model"]))
    return web.json_response({"running": entries, **router.router_extras()})


# ------------------------------------------------------------------------------------------ unloading


async def unload_all_text(request: web.Request) -> web.Response:
    await _unload_everything(request)
    return web.Response(text="OK")


async def unload_all_json(request: web.Request) -> web.Response:
    await _unload_everything(request)
    return web.json_response({"msg": "ok"})


async def _unload_everything(request: web.Request) -> None:
    router = state(request).router
    log.info("unload: stopping every model (%s %s)", request.method, request.path)
    # Returns once every process is dead; waiters for these models get a 500 from the scheduler.
    await router.unload()


def _named_model(request: web.Request) -> str | web.Response:
    """The local model the route's `{model}` names (an id or an alias), or the 404 to answer."""
    server = state(request)
    name = request.match_info["model"]
    model_id = server.config.real_model_name(name)
    if model_id is None or model_id not in server.router.processes:
        return error_response(
            request, 404, f"model not found: {name!r} is neither a model id nor an alias of this config",
        )
    request_record(request).model = model_id  # its access line names it
    return model_id


async def unload_model(request: web.Request) -> web.Response:
    server = state(request)
    model_id = _named_model(request)
    if isinstance(model_id, web.Response):
        return model_id
    log.info("unload: stopping %s (%s %s)", model_id, request.method, request.path)
    await server.router.unload([model_id])
    return web.Response(text="OK")


# ------------------------------------------------------------------------------------------ loading


async def load_model(request: web.Request) -> web.StreamResponse:
    """Start a model without an inference request: asked of the router as a request would be (the scheduler
    decides what stops for it and when), answered once the model is ready or could not start."""
    model_id = _named_model(request)
    if isinstance(model_id, web.Response):
        return model_id
    log.info("load: starting %s (%s %s)", model_id, request.method, request.path)
    cancel_on_hangup(request)  # a client that hangs up while the model loads leaves the queue
    return await _load(request, model_id)


async def _load(request: web.Request, model_id: str) -> web.StreamResponse:
    router = state(request).router
    try:
        async with router.acquire(model_id, request_options(request)) as process:
            last_start = process.last_start_duration
    except SchedulerError as err:
        return scheduler_error_response(request, err)
    return web.json_response({
        "msg": "ok", "model": model_id, "state": ProcessState.READY.value,
        "last_start_seconds": round(last_start, 3) if last_start is not None else None,
    })


# ------------------------------------------------------------------------------------------ small routes


async def health(request: web.Request) -> web.Response:
    return web.Response(text="OK")


async def root(request: web.Request) -> web.Response:
    raise web.HTTPFound("/ui")


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": __version__})
