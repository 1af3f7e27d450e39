"""llama-server's slot save and restore API, as far as llmswap's KV cache uses it (`--slot-save-path DIR`).

    GET  /slots                          [{"id": 0, "n_prompt_tokens": N, "is_processing": false}]
    POST /slots/0?action=save    {"filename": NAME}  writes DIR/NAME: N tokens of `--kv-bytes-per-token`
                                                     {"id_slot", "filename", "n_saved", "n_written"}
    POST /slots/0?action=restore {"filename": NAME}  reads it back {"id_slot", "filename", "n_restored",
                                                     "n_read", "timings"}

One slot. `n_prompt_tokens` is absent until the slot served a request, as in llama-server. A save writes
real bytes and a restore reads them, so their times are the disk's; the slot's tokens come back with it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from aiohttp import web

from llmswap.demo.context import Demo
from llmswap.demo.received import received
from llmswap.demo.replies import error_body

CHUNK = 1 << 20


def routes(demo: Demo, folder: Path) -> list[web.RouteDef]:
    async def slots(request: web.Request) -> web.StreamResponse:
        slot: dict[str, object] = {"id": 0, "is_processing": demo.state.generations_in_progress > 0}
        if demo.state.slot_tokens:
            slot["n_prompt_tokens"] = demo.state.slot_tokens
        return web.json_response([slot])  # a list: --echo has no place to go

    async def action(request: web.Request) -> web.StreamResponse:
        got = await received(request)
        body = got.body if isinstance(got.body, dict) else {}
        name = body.get("filename")
        kind = request.query.get("action", "")
        if request.match_info["slot"] != "0" or not isinstance(name, str) or "/" in name or not name:
            problem = error_body(got.path, 400, "slot 0 and a plain filename are needed")
            return demo.reply(got, problem, status=400)
        path = folder / name
        began = time.perf_counter()
        if kind == "save":
            tokens = demo.state.slot_tokens
            size = tokens * demo.options.kv_bytes_per_token
            await asyncio.to_thread(_write, path, size)
            ms = (time.perf_counter() - began) * 1000
            return demo.reply(got, {"id_slot": 0, "filename": name, "n_saved": tokens, "n_written": size,
                                    "timings": {"save_ms": ms}})
        if kind == "restore":
            try:
                size = await asyncio.to_thread(read_whole, path)
            except FileNotFoundError:
                return demo.reply(got, error_body(got.path, 400, f"failed to restore slot: {name}"),
                                  status=400)
            demo.state.slot_tokens = size // max(1, demo.options.kv_bytes_per_token)
            ms = (time.perf_counter() - began) * 1000
            return demo.reply(got, {"id_slot": 0, "filename": name, "n_restored": demo.state.slot_tokens,
                                    "n_read": size, "timings": {"restore_ms": ms}})
        return demo.reply(got, error_body(got.path, 400, f"unknown action {kind!r}"), status=400)

    return [web.get("/slots", slots), web.post("/slots/{slot}", action)]


def _write(path: Path, size: int) -> None:
    block = bytes(range(256)) * (CHUNK // 256)
    with path.open("wb") as file:
        left = size
        while left > 0:
            file.write(block[: min(left, CHUNK)])
            left -= CHUNK
        file.flush()


def read_whole(path: Path) -> int:
    """Read `path` whole (a thread's work: a restore, or a model's weights at start); the bytes read."""
    done = 0
    buffer = bytearray(CHUNK)
    with path.open("rb", buffering=0) as file:
        while count := file.readinto(buffer):
            done += count
    return done
