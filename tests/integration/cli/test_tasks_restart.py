"""The task queue across a kill -9 of the real `llmswap` process, and the `llmswap tasks` commands."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

from tests.helpers.cli import alive, demo_model, running_llmswap, stop_with, write_config
from tests.helpers.wait import eventually

# A 4-token answer takes about half a second: long enough to kill the proxy in the middle of a task.
SLOW = ("--tokens-per-second", "8")


def tasks_config(tmp_path: Path) -> tuple[Path, Path]:
    db = tmp_path / "tasks.sqlite"
    models = {"a": demo_model("a", *SLOW), "b": demo_model("b", *SLOW)}
    tasks = {"db": str(db), "types": {"letters": {"model": "a"}, "research": {"model": "b"}}}
    return write_config(tmp_path / "llmswap.yaml", models, tasks=tasks), db


def rows(db: Path) -> dict[int, dict[str, Any]]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return {r["id"]: dict(r) for r in conn.execute("SELECT * FROM background_tasks ORDER BY id")}


def tasks_cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmswap", "tasks", *args, "--config", str(config)],
        capture_output=True, text=True, timeout=60, check=False,
    )


async def submit(http: aiohttp.ClientSession, url: str, task_type: str, n: int) -> int:
    body = {"type": task_type, "params": {"messages": [{"role": "user", "content": f"{task_type} {n}"}],
                                          "max_tokens": 4}}
    async with http.post(f"{url}/api/tasks", json=body) as resp:
        assert resp.status == 201, await resp.text()
        return int((await resp.json())["id"])


async def test_kill_9_while_tasks_run_fails_running_and_resumes_queued(tmp_path: Path) -> None:
    config, db = tasks_config(tmp_path)
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        ids = [await submit(http, server.url, "letters", n) for n in range(4)]
        ids += [await submit(http, server.url, "research", n) for n in range(2)]

        async def one_running() -> bool:
            return any(r["status"] == "running" for r in rows(db).values())

        await eventually(one_running, what="a task running")
        upstreams = server.upstreams()
        os.kill(server.pid, signal.SIGKILL)
        await server.wait_exit()

    before = rows(db)
    running = [i for i, r in before.items() if r["status"] == "running"]
    assert len(running) == 1
    finished_before = {i for i, r in before.items() if r["status"] == "completed"}

    async def upstreams_gone() -> bool:
        return not any(alive(pid) for pid in upstreams.values())

    await eventually(upstreams_gone, what="the killed proxy's upstreams dying with it")

    async with running_llmswap(config):

        async def all_finished() -> bool:
            return all(r["status"] in ("completed", "failed") for r in rows(db).values())

        await eventually(all_finished, within=60, what="every task finishing after the restart")

    after = rows(db)
    assert sorted(after) == sorted(ids)  # nothing lost, nothing invented
    interrupted = after[running[0]]
    assert (interrupted["status"], interrupted["error"], interrupted["result"]) == (
        "failed", "Interrupted by restart", None)
    for task_id in set(ids) - set(running):
        assert after[task_id]["status"] == "completed", after[task_id]
        assert after[task_id]["result"] is not None
    for task_id in finished_before:  # ran once, before the kill, and were not run again
        assert after[task_id]["finished_at"] == before[task_id]["finished_at"]
    for task_type in ("letters", "research"):  # resumed in submission order within a type
        resumed = [i for i in ids if after[i]["task_type"] == task_type and i not in finished_before
                   and i not in running]
        starts = [after[i]["started_at"] for i in resumed]
        assert starts == sorted(starts)


async def test_tasks_commands_work_against_the_database_and_a_running_server(tmp_path: Path) -> None:
    config, _db = tasks_config(tmp_path)
    params = json.dumps({"messages": [{"role": "user", "content": "from the cli"}], "max_tokens": 4})

    bad = tasks_cli(config, "submit", "poems", "--params", params)
    assert bad.returncode == 1 and "unknown task type 'poems'" in bad.stderr

    # Without a server the row waits in the database; `cancel` marks it failed.
    queued = json.loads(tasks_cli(config, "submit", "letters", "--params", params).stdout)
    assert queued["is_new"] is True
    cancelled = tasks_cli(config, "cancel", str(queued["id"]))
    assert cancelled.returncode == 0, cancelled.stderr
    assert tasks_cli(config, "cancel", str(queued["id"])).returncode == 1  # no longer queued

    async with running_llmswap(config):
        submitted = json.loads(tasks_cli(config, "submit", "research", "--params", params).stdout)

        async def done() -> bool:
            shown = tasks_cli(config, "show", str(submitted["id"]))
            return json.loads(shown.stdout)["status"] == "completed"

        await eventually(done, within=30, what="the running server picking up a task the CLI queued")

    shown = json.loads(tasks_cli(config, "show", str(submitted["id"])).stdout)
    assert "demo b says" in shown["result"]["choices"][0]["message"]["content"]
    listing = tasks_cli(config, "list", "--status", "failed").stdout
    assert f"{queued['id']:>6}  failed" in listing and "cancelled" in listing
    await asyncio.sleep(0)


async def test_a_graceful_stop_puts_the_task_in_hand_back_in_the_queue(tmp_path: Path) -> None:
    """SIGTERM while a task runs longer than the stop waits for it: the task is not failed (neither by the
    upstream connections closing under it nor as "Interrupted by restart"); it is queued again, as it was,
    for the next start to run."""
    db = tmp_path / "tasks.sqlite"
    crawl = ("--tokens-per-second", "1")  # a 20-token answer takes 20 s: longer than the stop waits (5 s)
    tasks = {"db": str(db), "types": {"letters": {"model": "a"}}}
    config = write_config(tmp_path / "llmswap.yaml", {"a": demo_model("a", *crawl)}, tasks=tasks)
    body = {"type": "letters",
            "params": {"messages": [{"role": "user", "content": "long"}], "max_tokens": 20}}
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}/api/tasks", json=body) as response:
            task_id = int((await response.json())["id"])

        async def running() -> bool:
            return rows(db)[task_id]["status"] == "running"

        await eventually(running, within=20, what="the long task running")
        assert await stop_with(server) == 0
    row = rows(db)[task_id]
    assert (row["status"], row["error"], row["started_at"], row["preemptions"]) == ("queued", None, None, 0)
