"""An interactive request preempts a running task batch on a one-model GPU, and the task runs again later.

One model at a time (llama-swap's default group), `preemptBelow: 0`, tasks at their default priority -10.
A batch of two `summaries` tasks runs on `bg`, a demo upstream that answers slowly and echoes what it
received; while the first task's request is at the upstream, an interactive request for `chat` arrives.
It preempts the task — the task's upstream call is cut, its row goes back to the head of its queue — and
is served after one load (chat's). Then bg comes back, the preempted task runs again before the second
one, and both complete exactly once: the upstream saw three requests (the cut one and two whole ones).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmswap.config.model import SchedulerConfig, TasksConfig, TaskTypeConfig
from llmswap.process.events import ProcessEvent
from llmswap.router.types import RouterEvent
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.wait import eventually
from tests.integration.server.conftest import ServeConfig

# Forty tokens at ten a second: the first request is at the upstream for about four seconds, plenty of
# time for the interactive request to find it there (the test waits for it to arrive, not for a time);
# the second one is short.
SLOW = ("--tokens-per-second", "10", "--echo", "--log-requests")
TOKENS = {1: 40, 2: 5}


def preempting_config(tmp_path: Path) -> Any:
    tasks = TasksConfig(db=tmp_path / "tasks.sqlite", types={"summaries": TaskTypeConfig("summaries", "bg")})
    config = exclusive_config(demo_config("bg", *SLOW), demo_config("chat"), tasks=tasks)
    return dataclasses.replace(config, routing=dataclasses.replace(
        config.routing, scheduler=SchedulerConfig(preempt_below=0)))


async def get_json(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


@pytest.mark.timeout(90)
async def test_an_interactive_request_preempts_a_task_batch_and_the_task_completes_later_exactly_once(
    tmp_path: Path, serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(preempting_config(tmp_path))
    loads: list[str] = []

    def record(event: RouterEvent) -> None:
        if isinstance(event, ProcessEvent) and event.kind == "starting":
            loads.append(event.model)

    served.router.add_observer(record)

    def received_by_bg() -> list[str]:
        return [line for line in served.router.processes["bg"].logs.history()
                if "request POST /v1/chat/completions" in line]

    ids = []
    for n in (1, 2):
        params = {"messages": [{"role": "user", "content": f"summary {n}"}], "max_tokens": TOKENS[n]}
        async with http.post(served.at("/api/tasks"), json={"type": "summaries", "params": params}) as resp:
            assert resp.status == 201, await resp.text()
            ids.append((await resp.json())["id"])
    first, second = ids

    async def first_at_the_upstream() -> bool:
        row = await get_json(http, served.at(f"/api/tasks/{first}"))
        return row["status"] == "running" and len(received_by_bg()) == 1

    await eventually(first_at_the_upstream, within=30, interval=0.02, what="the first task at bg")

    loads_before = len(loads)
    chat = {"model": "chat", "messages": [{"role": "user", "content": "now"}], "max_tokens": 2}
    async with http.post(served.at("/v1/chat/completions"), json=chat) as resp:
        assert resp.status == 200, await resp.text()
    assert loads[loads_before:] == ["chat"], "the interactive request is served within one swap"

    async def both_finished() -> bool:
        rows = [await get_json(http, served.at(f"/api/tasks/{task_id}")) for task_id in ids]
        return all(row["status"] in ("completed", "failed") for row in rows)

    await eventually(both_finished, within=60, interval=0.05, what="both tasks finishing")
    rows = {task_id: await get_json(http, served.at(f"/api/tasks/{task_id}")) for task_id in ids}
    assert [(rows[i]["status"], rows[i]["preemptions"]) for i in ids] == [("completed", 1), ("completed", 0)]
    for n, task_id in enumerate(ids, start=1):
        # The whole answer, to the request the task made: the upstream echoes what it received.
        result = rows[task_id]["result"]
        assert result["echo"]["body"]["messages"] == [{"role": "user", "content": f"summary {n}"}]
        assert result["usage"]["completion_tokens"] == TOKENS[n]
    # Back at the head of its queue: the preempted task finished before the second one started.
    assert rows[first]["finished_at"] <= rows[second]["started_at"]
    # Three requests reached bg: the cut attempt, then each task once, whole.
    assert len(received_by_bg()) == 3
    assert loads == ["bg", "chat", "bg"]
    stats = await get_json(http, served.at("/api/tasks/stats"))
    assert stats["preempted"] == {"requeued": {"summaries": 1}, "gave_up": {}}
    assert stats["counts"]["summaries"]["completed"] == 2


@pytest.mark.timeout(90)
async def test_a_preempted_batch_request_is_retried_and_counted_once(
    tmp_path: Path, serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(preempting_config(tmp_path))

    def received_by_bg() -> int:
        return sum("request POST /v1/chat/completions" in line
                   for line in served.router.processes["bg"].logs.history())

    lines = [json.dumps({"custom_id": f"req-{n}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "bg", "max_tokens": TOKENS[n],
                                  "messages": [{"role": "user", "content": f"line {n}"}]}})
             for n in (1, 2)]
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", ("\n".join(lines) + "\n").encode(), filename="requests.jsonl")
    async with http.post(served.at("/v1/files"), data=form) as resp:
        assert resp.status == 200, await resp.text()
        file_id = (await resp.json())["id"]
    create = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    async with http.post(served.at("/v1/batches"), json=create) as resp:
        assert resp.status == 200, await resp.text()
        batch_id = (await resp.json())["id"]

    async def first_at_the_upstream() -> bool:
        return received_by_bg() == 1

    await eventually(first_at_the_upstream, within=30, interval=0.02, what="the first request at bg")
    chat = {"model": "chat", "messages": [{"role": "user", "content": "now"}], "max_tokens": 2}
    async with http.post(served.at("/v1/chat/completions"), json=chat) as resp:
        assert resp.status == 200, await resp.text()

    async def completed() -> bool:
        return (await get_json(http, served.at(f"/v1/batches/{batch_id}")))["status"] == "completed"

    await eventually(completed, within=60, interval=0.1, what="the batch completing")
    batch = await get_json(http, served.at(f"/v1/batches/{batch_id}"))
    assert batch["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    assert batch["error_file_id"] is None
    async with http.get(served.at(f"/v1/files/{batch['output_file_id']}/content")) as resp:
        output = [json.loads(line) for line in (await resp.text()).splitlines()]
    assert sorted(r["custom_id"] for r in output) == ["req-1", "req-2"]
    for record in output:
        n = record["custom_id"].removeprefix("req-")
        body = record["response"]["body"]
        assert body["echo"]["body"]["messages"] == [{"role": "user", "content": f"line {n}"}]
    assert received_by_bg() == 3  # the cut attempt, then each request once, whole
    stats = await get_json(http, served.at("/api/tasks/stats"))
    assert stats["preempted"] == {"requeued": {"batch:bg": 1}, "gave_up": {}}
