"""/running and /v1/models under the vram router: each model's footprint and the budget in use."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from llmswap.config.model import Config, RouterConfig, RoutingConfig, VramSettings
from llmswap.machine import FakeReader, GiB
from llmswap.router import build_router
from tests.helpers.models import demo_config
from tests.integration.server.conftest import ServeConfig


async def test_running_and_models_show_footprints_and_budget(
    tmp_path: Path, serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    models = {
        "big": demo_config("big", "--fake-vram", "3GiB", "--fake-gpu-dir", str(gpu), vram=2 * GiB),
        "small": demo_config("small", vram=1 * GiB, aliases=("tiny",)),
    }
    config = Config(
        models=models, aliases={"tiny": "small"}, state_dir=tmp_path / "state",
        routing=RoutingConfig(router=RouterConfig(use="vram", vram=VramSettings(reserve=0))),
    )
    router = build_router(config, reader=FakeReader(totals=(8 * GiB,), gpu_dir=gpu))
    served = await serve_config(config, router=router)

    body = {"model": "big", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with http.post(served.at("/v1/chat/completions"), json=body) as resp:
        assert resp.status == 200

    async with http.get(served.at("/running")) as resp:
        running = await resp.json()
    (entry,) = running["running"]
    assert entry["model"] == "big"
    assert entry["vram"]["declared"] == 2 * GiB
    assert entry["vram"]["learned"] == 3 * GiB  # measured above the declaration: the larger one counts
    assert entry["vram"]["footprint"] == 3 * GiB and entry["vram"]["source"] == "learned"
    device = running["vram"]["devices"]["GPU 0"]
    assert (device["budget"], device["in_use"]) == (8 * GiB, 3 * GiB)

    async with http.get(served.at("/v1/models")) as resp:
        listed = {m["id"]: m for m in (await resp.json())["data"]}
    assert listed["small"]["meta"]["llmswap"]["vram"]["footprint"] == 1 * GiB
    assert listed["small"]["meta"]["llmswap"]["vram"]["source"] == "declared"
    assert listed["big"]["meta"]["llmswap"]["vram"]["footprint"] == 3 * GiB
