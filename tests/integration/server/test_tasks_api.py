"""Server mode of the task queue: /api/tasks over real demo upstreams, batched by type through the router."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from llmswap.config.model import (
    Config,
    GroupConfig,
    RouterConfig,
    RoutingConfig,
    TasksConfig,
    TaskTypeConfig,
)
from llmswap.server.reload import apply_config
from llmswap.tasks.queue.db import insert_task
from tests.helpers.models import demo_config
from tests.helpers.wait import eventually
from tests.integration.server.conftest import ServeConfig

TYPES = {"letters": "a", "research": "b", "summaries": "c"}


def tasks_config(tmp_path: Path, gate: Path | None = None) -> Config:
    """With a `gate`, the task models stay loading until that file exists (the chat model does not wait)."""
    held = ("--healthy-when", str(gate)) if gate is not None else ()
    models = {m: demo_config(m, "--startup-delay", "0.2", *held) for m in ("a", "b", "c")}
    models["chat"] = demo_config("chat", "--startup-delay", "0.2")
    # Task models swap among themselves; the interactive model runs beside them, so interactive traffic
    # never evicts a batch and every load seen below is the task queue's doing.
    groups = {
        "(default)": GroupConfig("(default)"),
        "batch": GroupConfig("batch", swap=True, exclusive=False, members=("a", "b", "c")),
        "interactive": GroupConfig("interactive", swap=True, exclusive=False, members=("chat",)),
    }
    tasks = TasksConfig(
        db=tmp_path / "tasks.sqlite",
        types={name: TaskTypeConfig(name, model) for name, model in TYPES.items()},
    )
    return Config(models=models, routing=RoutingConfig(router=RouterConfig(groups=groups)), tasks=tasks)


def chat_params(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 3}


async def submit(http: aiohttp.ClientSession, url: str, task_type: str, **extra: Any) -> dict[str, Any]:
    body = {"type": task_type, "params": chat_params(f"{task_type} task"), **extra}
    async with http.post(f"{url}/api/tasks", json=body) as resp:
        assert resp.status in (200, 201), await resp.text()
        return dict(await resp.json())


async def stats(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(f"{url}/api/tasks/stats") as resp:
        assert resp.status == 200
        return dict(await resp.json())


async def test_thirty_tasks_load_each_model_once_while_interactive_requests_are_served(
    tmp_path: Path, serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    gate = tmp_path / "gate"  # the first model stays loading until every task is in: one batch per type
    served = await serve_config(tasks_config(tmp_path, gate))
    loads: Counter[str] = Counter()
    served.router.add_observer(
        lambda e: loads.update([e.model]) if getattr(e, "kind", "") == "starting" else None
    )

    ids = [(await submit(http, served.url, task_type))["id"] for _ in range(10) for task_type in TYPES]
    cancelled = (await submit(http, served.url, "summaries"))["id"]
    async with http.delete(f"{served.url}/api/tasks/{cancelled}") as resp:
        assert resp.status == 200  # no task model is ready yet: still queued
        assert (await resp.json())["error"] == "cancelled"
    gate.touch()

    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for _ in range(3):  # interactive traffic while the batches run
        async with http.post(f"{served.url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            assert "demo chat says" in (await resp.json())["choices"][0]["message"]["content"]

    async def all_done() -> bool:
        counts = (await stats(http, served.url))["counts"]
        return sum(c.get("completed", 0) for c in counts.values()) == len(ids)

    await eventually(all_done, within=60, what="all 30 tasks completing")
    assert {loads[m] for m in TYPES.values()} == {1}  # one load per type: batched
    assert loads["chat"] == 1

    for task_id in ids:
        async with http.get(f"{served.url}/api/tasks/{task_id}") as resp:
            row = await resp.json()
        assert row["status"] == "completed"
        model = TYPES[row["type"]]
        assert f"demo {model} says" in row["result"]["choices"][0]["message"]["content"]
    async with http.get(f"{served.url}/api/tasks/{cancelled}") as resp:
        row = await resp.json()
    assert (row["status"], row["error"], row["result"]) == ("failed", "cancelled", None)

    summary = await stats(http, served.url)
    assert summary["counts"]["summaries"]["failed"] == 1
    assert summary["batches_started"] == {"letters": 1, "research": 1, "summaries": 1}


async def test_task_api_errors_and_listing(
    tmp_path: Path, serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(tasks_config(tmp_path))
    url = served.url
    async with http.post(f"{url}/api/tasks", json={"type": "poems", "params": chat_params("x")}) as resp:
        assert resp.status == 400
        assert "unknown task type 'poems'" in (await resp.json())["error"]["message"]
    broken = {"data": b"{not json", "headers": {"Content-Type": "application/json"}}
    async with http.post(f"{url}/api/tasks", **broken) as resp:  # type: ignore[arg-type]
        assert resp.status == 400
    async with http.post(f"{url}/api/tasks", json={"type": "letters", "params": "text"}) as resp:
        assert resp.status == 400
    async with http.get(f"{url}/api/tasks/999999") as resp:
        assert resp.status == 404

    first = await submit(http, url, "letters", job_id=7)
    again = await submit(http, url, "letters", job_id=7)
    assert first["is_new"] is True
    assert again == {"id": first["id"], "is_new": False, "status": again["status"]}

    async def finished() -> bool:
        async with http.get(f"{url}/api/tasks/{first['id']}") as resp:
            return (await resp.json())["status"] == "completed"

    await eventually(finished, within=30, what="the task completing")
    async with http.delete(f"{url}/api/tasks/{first['id']}") as resp:
        assert resp.status == 409  # only queued tasks can be cancelled
    async with http.get(f"{url}/api/tasks", params={"status": "completed", "type": "letters"}) as resp:
        listed = (await resp.json())["tasks"]
    assert [t["id"] for t in listed] == [first["id"]]
    async with http.get(f"{url}/api/tasks", params={"status": "nope"}) as resp:
        assert resp.status == 400


async def test_task_routes_without_tasks_section(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(Config(models={"a": demo_config("a")}))
    async with http.get(f"{served.url}/api/tasks/stats") as resp:
        assert resp.status == 404
        assert "tasks:" in json.dumps(await resp.json())
    await asyncio.sleep(0)


async def finished(http: aiohttp.ClientSession, url: str, task_id: int) -> dict[str, Any]:
    """Wait for a task to complete; its row."""
    row: dict[str, Any] = {}

    async def done() -> bool:
        nonlocal row
        async with http.get(f"{url}/api/tasks/{task_id}") as resp:
            row = dict(await resp.json())
        assert row["status"] != "failed", row
        return row["status"] == "completed"

    await eventually(done, within=30, what=f"task {task_id} completing")
    return row


def answered_by(row: dict[str, Any]) -> str:
    content = row["result"]["choices"][0]["message"]["content"]
    return content.split(" says")[0].removeprefix("demo ")


async def test_a_reload_reconfigures_the_task_queue_in_place(
    tmp_path: Path, serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    full = tasks_config(tmp_path)
    assert full.tasks is not None
    served = await serve_config(dataclasses.replace(full, tasks=None))
    url = served.url
    async with http.get(f"{url}/api/tasks/stats") as resp:
        assert resp.status == 404

    # A reload that adds the section starts the queue.
    assert apply_config(served.state, full).applied
    assert answered_by(await finished(http, url, (await submit(http, url, "letters"))["id"])) == "a"

    # One that moves a type to another model, drops one, adds one and changes the priority applies in
    # place, to the next task.
    types = {"letters": TaskTypeConfig("letters", "c"), "research": TaskTypeConfig("research", "b"),
             "digests": TaskTypeConfig("digests", "b")}
    moved = dataclasses.replace(full, tasks=dataclasses.replace(full.tasks, types=types, priority=5))
    assert apply_config(served.state, moved).applied
    service = served.services.tasks.enabled()
    assert service is not None and service.tasks.priority == 5
    assert answered_by(await finished(http, url, (await submit(http, url, "letters"))["id"])) == "c"
    assert answered_by(await finished(http, url, (await submit(http, url, "digests"))["id"])) == "b"
    async with http.post(f"{url}/api/tasks", json={"type": "summaries", "params": chat_params("x")}) as resp:
        assert resp.status == 400

    # One without the section switches the queue off; what is queued meanwhile (here by the CLI, straight
    # into the database) waits, and runs once a reload brings its type back.
    assert apply_config(served.state, dataclasses.replace(full, tasks=None)).applied
    async with http.get(f"{url}/api/tasks/stats") as resp:
        assert resp.status == 404
    waiting, _ = insert_task(full.tasks.db, "summaries", 0, chat_params("later"), dedupe=False)
    assert apply_config(served.state, full).applied
    assert answered_by(await finished(http, url, waiting)) == "c"

    # The database itself changes only with a restart: the queue keeps the one it has.
    elsewhere = dataclasses.replace(full, tasks=dataclasses.replace(full.tasks, db=tmp_path / "other.sqlite"))
    assert apply_config(served.state, elsewhere).applied
    service = served.services.tasks.enabled()
    assert service is not None and service.db == full.tasks.db
    async with http.get(f"{url}/api/tasks/{waiting}") as resp:
        assert (await resp.json())["status"] == "completed"
