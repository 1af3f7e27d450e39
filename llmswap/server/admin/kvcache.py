"""`/api/kvcache`: what the `kvCache` models have saved on disk, and a way to clear a model's saves.

    GET    /api/kvcache           {"dir", "save", "max_size", "total_bytes", "models": [{"model", "enabled",
                                   "dir", "bytes", "saves": [{"slot", "tokens", "bytes", "age_seconds"}],
                                   "rates": {"prompt_tokens_per_second", "bytes_per_token",
                                   "save_bytes_per_second", "restore_bytes_per_second", "skipped_saves"}}]}
                                  (`rates`: what `kvCache.save: auto` decides from; null until measured)
    DELETE /api/kvcache/{model}   {"model", "deleted", "bytes"}: the model's saves are gone; a running server
                                  keeps its slots, and its next stop saves them again

Saves are files under `kvCache.dir`, one folder per model (llmswap.kvcache); a model without `kvCache: true`
is listed only when it left saves there. Both routes sit behind the API keys like every `/api/` route. The
folders are read (and cleared) on a worker thread: a folder on a slow disk must not hold the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from llmswap.activity.record import ActivityRecord
from llmswap.config.model import Config, ModelConfig
from llmswap.kvcache import Save, SaveFolder
from llmswap.server.http.errors import error_response
from llmswap.server.inference.resolve import unknown_model_message
from llmswap.server.state import state

if TYPE_CHECKING:
    from llmswap.activity.recorder import ActivityListener
    from llmswap.router.router import Router


def setup(app: web.Application) -> None:
    app.router.add_get("/api/kvcache", list_saves)
    app.router.add_delete("/api/kvcache/{model:.+}", clear_saves)


class PromptRates:
    """What teaches `kvCache.save: auto` what processing a slot's tokens again costs: each answer's
    `timings` (llama-server's prompt processing rate), from its activity row, into the router's
    `llmswap.kvcache.rates`. Listens to the rows only while the config has a `kvCache` model, so a
    request to a config without one does no work for it."""

    def __init__(self, router_of: Callable[[], Router]) -> None:
        self._router_of = router_of

    def follow(self, config: Config, listeners: list[ActivityListener]) -> None:
        """Listen to the rows (`listeners`: the recorder's) when `config` has a kvCache model, else not."""
        wanted = any(model.kv_cache is not None for model in config.models.values())
        listening = self.learn in listeners
        if wanted and not listening:
            listeners.append(self.learn)
        elif listening and not wanted:
            listeners.remove(self.learn)

    def learn(self, record: ActivityRecord) -> None:
        tokens = record.tokens
        self._router_of().kv.rates.learn_prompt(record.model, tokens.input_tokens, tokens.prompt_per_second)


async def list_saves(request: web.Request) -> web.Response:
    config = state(request).config
    settings = config.kv_cache
    now = time.time()
    rates = state(request).router.kv.rates
    records = await asyncio.to_thread(lambda: [_model_record(model, now) for model in config.models.values()])
    models = [record | ({"rates": rates.shown(record["model"], settings.dir)} if settings is not None else {})
              for record in records if record["enabled"] or record["saves"]]
    return web.json_response({
        "dir": str(settings.dir) if settings is not None else None,
        "save": settings.save if settings is not None else None,
        "max_size": settings.max_size if settings is not None else None,
        "total_bytes": sum(record["bytes"] for record in models),
        "models": models,
    })


async def clear_saves(request: web.Request) -> web.Response:
    config = state(request).config
    name = request.match_info["model"]
    model_id = config.real_model_name(name)
    if model_id is None:
        return error_response(request, 404, unknown_model_message(config, name), code="model_not_found")
    folder = config.models[model_id].kv_dir
    restoring = frozenset(state(request).router.kv.restoring)
    deleted = await asyncio.to_thread(
        lambda: SaveFolder(folder).clear(restoring) if folder is not None and folder.is_dir() else [])
    return web.json_response({"model": model_id, "deleted": len(deleted),
                              "bytes": sum(save.bytes for save in deleted)})


def _model_record(model: ModelConfig, now: float) -> dict[str, Any]:
    saves = SaveFolder(model.kv_dir).saves() if model.kv_dir is not None and model.kv_dir.is_dir() else []
    return {
        "model": model.id, "enabled": model.kv_cache is not None,
        "dir": str(model.kv_dir) if model.kv_dir is not None else None,
        "bytes": sum(save.bytes for save in saves),
        "saves": [_save_record(save, now) for save in saves],
    }


def _save_record(save: Save, now: float) -> dict[str, Any]:
    return {"slot": save.slot, "tokens": save.tokens if save.tokens >= 0 else None, "bytes": save.bytes,
            "age_seconds": round(max(0.0, now - save.used), 1)}
