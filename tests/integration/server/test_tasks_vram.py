"""Task types under the vram router: memory is the router's to budget.

Two types whose models fit on the GPU together run their batches side by side (the swapper evicts nothing,
so either scheduler grants both lanes at once); two that do not run one batch after the other, each model
loaded once: each lane tells the router's scheduler its type's queue depth, and the scheduler serves one
type's announced backlog before it swaps. The GPU is faked (the demo writes its
footprint where a FakeReader reads it, as NVML would report it); everything else is real.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmswap.config.model import (
    Config,
    ModelConfig,
    RouterConfig,
    RoutingConfig,
    SchedulerConfig,
    TasksConfig,
    TaskTypeConfig,
    VramSettings,
)
from llmswap.machine import FakeReader, GiB
from llmswap.process.events import ProcessEvent
from llmswap.router import build_router
from llmswap.router.types import RouterEvent
from llmswap.router.vram import VramPolicy
from tests.helpers.models import demo_config
from tests.helpers.wait import eventually
from tests.integration.server.conftest import ServeConfig

TASKS_PER_TYPE = 4


def model(name: str, gpu_dir: Path) -> ModelConfig:
    # Slow enough that one type's batch is still running when the other's could start.
    flags = ("--fake-vram", "4GiB", "--fake-gpu-dir", str(gpu_dir), "--tokens-per-second", "40")
    return demo_config(name, *flags, vram=4 * GiB)


def config(tmp_path: Path, gpu_dir: Path, scheduler: str) -> Config:
    routing = RoutingConfig(router=RouterConfig(use="vram", vram=VramSettings(reserve=0)),
                            scheduler=SchedulerConfig(use=scheduler))
    tasks = TasksConfig(
        db=tmp_path / "tasks.sqlite",
        types={"letters": TaskTypeConfig("letters", "a"), "research": TaskTypeConfig("research", "b")},
    )
    return Config(models={m: model(m, gpu_dir) for m in ("a", "b")}, routing=routing, tasks=tasks,
                  state_dir=tmp_path / "state")


class Residency:
    """Which models are loaded, and the most that ever were at once."""

    def __init__(self) -> None:
        self.ready: set[str] = set()
        self.most = 0
        self.loads: Counter[str] = Counter()

    def __call__(self, event: RouterEvent) -> None:
        if not isinstance(event, ProcessEvent):
            return
        if event.kind == "ready":
            self.loads[event.model] += 1
            self.ready.add(event.model)
            self.most = max(self.most, len(self.ready))
        elif event.kind in ("stopping", "stopped", "exited"):
            self.ready.discard(event.model)


async def run_both_types(
    tmp_path: Path, serve_config: ServeConfig, http: aiohttp.ClientSession, gpu_total: int, scheduler: str
) -> tuple[Residency, dict[str, Any]]:
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    cfg = config(tmp_path, gpu, scheduler)
    router = build_router(cfg, reader=FakeReader(totals=(gpu_total,), gpu_dir=gpu))
    assert isinstance(router.policy, VramPolicy)
    router.policy.sample_interval = 0
    residency = Residency()
    router.add_observer(residency)
    served = await serve_config(cfg, router=router)
    params = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 8}
    for _ in range(TASKS_PER_TYPE):
        for task_type in ("letters", "research"):
            async with http.post(served.at("/api/tasks"), json={"type": task_type, "params": params}) as resp:
                assert resp.status == 201, await resp.text()

    async def all_completed() -> bool:
        async with http.get(served.at("/api/tasks/stats")) as resp:
            counts = (await resp.json())["counts"]
        return sum(c.get("completed", 0) for c in counts.values()) == 2 * TASKS_PER_TYPE

    await eventually(all_completed, within=60, interval=0.05, what="every task completing")
    async with http.get(served.at("/api/tasks/stats")) as resp:
        return residency, await resp.json()


@pytest.mark.parametrize("scheduler", ["fifo", "batch"])
async def test_two_task_types_whose_models_fit_together_run_side_by_side(
    tmp_path: Path, serve_config: ServeConfig, http: aiohttp.ClientSession, scheduler: str
) -> None:
    residency, stats = await run_both_types(tmp_path, serve_config, http, 10 * GiB, scheduler)
    assert residency.most == 2
    assert residency.loads == {"a": 1, "b": 1}
    assert stats["batches_started"] == {"letters": 1, "research": 1}


@pytest.mark.parametrize("scheduler", ["fifo", "batch"])
@pytest.mark.parametrize("gpu_total", [6 * GiB], ids=["room-for-one"])
async def test_two_task_types_whose_models_do_not_fit_together_run_one_batch_at_a_time(
    tmp_path: Path, serve_config: ServeConfig, http: aiohttp.ClientSession, gpu_total: int, scheduler: str
) -> None:
    residency, stats = await run_both_types(tmp_path, serve_config, http, gpu_total, scheduler)
    assert residency.most == 1
    assert residency.loads == {"a": 1, "b": 1}  # each type's tasks in one batch: no swap back and forth
    assert stats["batches_started"] == {"letters": 1, "research": 1}
