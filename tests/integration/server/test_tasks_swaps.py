"""Tasks ride along with interactive traffic under the batch scheduler instead of adding swaps of their own.

One model fits at a time. Interactive requests go round three models; tasks for the same three models
cost at most one extra swap per task type: the scheduler that plans the interactive traffic batches them.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp

from llmswap.config.model import (
    BatchSettings,
    Config,
    GroupConfig,
    RouterConfig,
    RoutingConfig,
    SchedulerConfig,
    TasksConfig,
    TaskTypeConfig,
)
from llmswap.process.events import ProcessEvent
from llmswap.router.types import RouterEvent
from tests.helpers.models import demo_config
from tests.helpers.wait import eventually
from tests.integration.server.conftest import ServeConfig

MODELS = ("a", "b", "c")
TYPES = {"letters": "a", "research": "b", "summaries": "c"}
ROUNDS = 3
TASKS_PER_TYPE = 3


def fresh(path: Path) -> Path:
    path.mkdir()
    return path


def config(tmp_path: Path, *, with_tasks: bool) -> Config:
    groups = {"(default)": GroupConfig("(default)", members=MODELS)}  # one model at a time
    scheduler = SchedulerConfig(use="batch", batch=BatchSettings(max_wait=2.0, min_residency=0.5))
    tasks = TasksConfig(
        db=tmp_path / "tasks.sqlite",
        types={name: TaskTypeConfig(name, model) for name, model in TYPES.items()},
    )
    return Config(
        models={m: demo_config(m) for m in MODELS},
        routing=RoutingConfig(router=RouterConfig(use="group", groups=groups), scheduler=scheduler),
        tasks=tasks if with_tasks else None,
    )


async def swaps_for(
    tmp_path: Path, serve_config: ServeConfig, http: aiohttp.ClientSession, *, with_tasks: bool
) -> int:
    served = await serve_config(config(tmp_path, with_tasks=with_tasks))
    loads: list[str] = []

    def record(event: RouterEvent) -> None:
        if isinstance(event, ProcessEvent) and event.kind == "starting":
            loads.append(event.model)

    served.router.add_observer(record)
    if with_tasks:
        params = {"messages": [{"role": "user", "content": "later"}], "max_tokens": 3}
        for task_type in TYPES:
            for _ in range(TASKS_PER_TYPE):
                task = {"type": task_type, "params": params}
                async with http.post(served.at("/api/tasks"), json=task) as resp:
                    assert resp.status == 201, await resp.text()
    for _ in range(ROUNDS):
        for model in MODELS:
            body = {"model": model, "messages": [{"role": "user", "content": "now"}], "max_tokens": 3}
            async with http.post(served.at("/v1/chat/completions"), json=body) as resp:
                assert resp.status == 200, await resp.text()
    if with_tasks:

        async def all_completed() -> bool:
            async with http.get(served.at("/api/tasks/stats")) as resp:
                counts = (await resp.json())["counts"]
            return sum(c.get("completed", 0) for c in counts.values()) == len(TYPES) * TASKS_PER_TYPE

        await eventually(all_completed, within=60, interval=0.05, what="every task completing")
    return len(loads)


async def test_tasks_cost_at_most_one_swap_per_type_beside_interactive_traffic(
    tmp_path: Path, serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    alone = await swaps_for(fresh(tmp_path / "alone"), serve_config, http, with_tasks=False)
    together = await swaps_for(fresh(tmp_path / "together"), serve_config, http, with_tasks=True)
    assert together <= alone + len(TYPES), (alone, together)
