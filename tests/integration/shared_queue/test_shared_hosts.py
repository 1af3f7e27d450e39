"""Two and three real `llmswap` processes draining one PostgreSQL queue: tasks run where their type is
served, exactly once, across a kill -9; any host answers for every task, file and batch."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import openai

from llmswap.tasks.queue import db
from llmswap.tasks.queue.sql import PostgresDb
from tests.helpers.cli import LlmswapProcess, demo_model, running_llmswap, stop_with, write_config
from tests.helpers.postgres import Cluster, postgres_bin, running_cluster
from tests.helpers.wait import eventually

LEASE = 3  # seconds: a killed host's task is back in the queue within a lease and a heartbeat
SLOW = ("--tokens-per-second", "8")  # a 4-token answer takes half a second
SLOWER = ("--tokens-per-second", "2")  # two seconds: ample time to kill its host in the middle of it


def host_config(tmp_path: Path, name: str, url: str, types: dict[str, str], models: dict[str, Any],
                lease: float = LEASE) -> Path:
    tasks = {"db": url, "host": name, "leaseSeconds": lease,
             "types": {task_type: {"model": model} for task_type, model in types.items()}}
    return write_config(tmp_path / f"{name}.yaml", models, tasks=tasks)


async def submit(http: aiohttp.ClientSession, host: LlmswapProcess, task_type: str, n: int) -> int:
    body = {"type": task_type, "params": {"messages": [{"role": "user", "content": f"{task_type} {n}"}],
                                          "max_tokens": 4}}
    async with http.post(f"{host.url}/api/tasks", json=body) as response:
        assert response.status == 201, await response.text()
        return int((await response.json())["id"])


async def tasks_of(http: aiohttp.ClientSession, host: LlmswapProcess) -> dict[int, dict[str, Any]]:
    async with http.get(f"{host.url}/api/tasks?limit=1000") as response:
        assert response.status == 200
        return {t["id"]: t for t in (await response.json())["tasks"]}


async def all_done(http: aiohttp.ClientSession, host: LlmswapProcess, ids: list[int]) -> bool:
    shown = await tasks_of(http, host)
    return all(shown.get(i, {}).get("status") in ("completed", "failed") for i in ids)


async def test_tasks_submitted_on_one_host_run_on_the_host_that_serves_their_type(
    tmp_path: Path, pg_db: PostgresDb
) -> None:
    box1 = host_config(tmp_path, "box1", pg_db.url, {"letters": "a"}, {"a": demo_model("a")})
    box2 = host_config(tmp_path, "box2", pg_db.url, {"research": "b"}, {"b": demo_model("b")})
    async with (running_llmswap(box1) as one, running_llmswap(box2) as two,
                aiohttp.ClientSession() as http):

        async def both_joined() -> bool:
            async with http.get(f"{one.url}/api/tasks/stats") as response:
                hosts = (await response.json()).get("hosts", [])
            return sorted(h["name"] for h in hosts if h["live"]) == ["box1", "box2"]

        await eventually(both_joined, within=20, what="both hosts registered in the shared queue")
        listed = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "llmswap", "ps", "--all-hosts", "--url", two.url],
            capture_output=True, text=True, timeout=30, check=False)
        assert listed.returncode == 0, listed.stderr
        queue_table = listed.stdout.split("TASK QUEUE HOST", 1)[1].splitlines()
        assert [line.split()[:2] for line in queue_table[1:]] == [["box1", "live"], ["box2", "(this)"]]
        assert "batch:b, research" in listed.stdout
        ids = [await submit(http, one, "letters", n) for n in range(3)]
        ids += [await submit(http, one, "research", n) for n in range(3)]

        async with http.post(f"{two.url}/api/tasks", json={"type": "poems", "params": {}}) as response:
            assert response.status == 400
            message = (await response.json())["error"]["message"]
        assert "unknown task type 'poems'" in message and "letters, research" in message

        await eventually(lambda: all_done(http, one, ids), within=30, what="every task finishing")
        seen_on_one, seen_on_two = await tasks_of(http, one), await tasks_of(http, two)
        assert seen_on_one == seen_on_two  # one queue: every host shows the same rows
        for task_id in ids:
            row = seen_on_one[task_id]
            assert row["status"] == "completed", row
            assert row["host"] == {"letters": "box1", "research": "box2"}[row["type"]]
            assert row["preemptions"] == 0
            assert f"demo {'a' if row['type'] == 'letters' else 'b'} says" in json.dumps(row["result"])

        # The Batch API is shared too: a batch for box2's model, created and read back on box1.
        async with (openai.AsyncOpenAI(base_url=f"{one.url}/v1", api_key="unused", max_retries=0) as client,
                    openai.AsyncOpenAI(base_url=f"{two.url}/v1", api_key="unused",
                                       max_retries=0) as two_files):
            lines = [json.dumps({"custom_id": f"r{n}", "method": "POST", "url": "/v1/chat/completions",
                                 "body": {"model": "b", "max_tokens": 4,
                                          "messages": [{"role": "user", "content": f"batch {n}"}]}})
                     for n in range(2)]
            uploaded = await client.files.create(file=("in.jsonl", ("\n".join(lines) + "\n").encode()),
                                                 purpose="batch")
            batch = await client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                                completion_window="24h")

            async def batch_completed() -> bool:
                return (await client.batches.retrieve(batch.id)).status == "completed"

            await eventually(batch_completed, within=30, what="the batch completing on the host serving b")
            done = await client.batches.retrieve(batch.id)
            assert done.output_file_id is not None and done.request_counts is not None
            assert done.request_counts.completed == 2
            output = (await client.files.content(done.output_file_id)).text
            assert sorted(json.loads(line)["custom_id"] for line in output.splitlines()) == ["r0", "r1"]
            rows = db.job_tasks(pg_db, done_seq(pg_db, batch.id), "batch:")
            assert {r.host for r in rows} == {"box2"}
            assert (await two_files.files.content(done.output_file_id)).text == output


def done_seq(pg_db: PostgresDb, batch_id: str) -> int:
    from llmswap.tasks.batch_api import store

    found = store.get_batch(pg_db, batch_id)
    assert found is not None
    return found.seq


async def test_a_host_killed_mid_task_loses_nothing_and_its_task_runs_once_elsewhere(
    tmp_path: Path, pg_db: PostgresDb
) -> None:
    """Three hosts: box0 only takes submissions; box1 and box2 both serve `letters`. box1 is killed with
    -9 while it runs a task: the task's lease lapses and box2 runs it, recording its result once."""
    box0 = host_config(tmp_path, "box0", pg_db.url, {}, {"z": demo_model("z")})
    box1 = host_config(tmp_path, "box1", pg_db.url, {"letters": "a"}, {"a": demo_model("a", *SLOWER)})
    box2 = host_config(tmp_path, "box2", pg_db.url, {"letters": "a"}, {"a": demo_model("a", *SLOW)})
    async with (running_llmswap(box0) as zero, running_llmswap(box1) as one,
                aiohttp.ClientSession() as http):
        # box0 takes `letters` only once a live host serves it (400 before box1 joined).
        await eventually(lambda: _joined(http, zero, 2), within=20, what="box0 and box1 joined")
        ids = [await submit(http, zero, "letters", n) for n in range(4)]

        killed: list[int] = []

        async def one_running() -> bool:
            killed[:] = [i for i, t in (await tasks_of(http, zero)).items()
                         if t["status"] == "running" and t["host"] == "box1"]
            return bool(killed)

        await eventually(one_running, within=20, what="box1 running a task")
        os.kill(one.pid, signal.SIGKILL)
        await one.wait_exit()
        assert len(killed) == 1

        async with running_llmswap(box2):
            await eventually(lambda: all_done(http, zero, ids), within=40, what="every task finishing")
        final = await tasks_of(http, zero)

    assert sorted(final) == sorted(ids)  # nothing lost, nothing invented
    again = final[killed[0]]
    assert (again["status"], again["host"], again["preemptions"]) == ("completed", "box2", 1)
    assert all(final[i]["status"] == "completed" for i in ids)


async def test_a_host_restarted_after_kill_9_runs_its_lost_task_again(
    tmp_path: Path, pg_db: PostgresDb
) -> None:
    box1 = host_config(tmp_path, "box1", pg_db.url, {"letters": "a"}, {"a": demo_model("a", *SLOWER)})
    async with aiohttp.ClientSession() as http:
        async with running_llmswap(box1) as one:
            task_id = await submit(http, one, "letters", 0)

            async def running() -> bool:
                return (await tasks_of(http, one))[task_id]["status"] == "running"

            await eventually(running, within=20, what="the task running")
            os.kill(one.pid, signal.SIGKILL)
            await one.wait_exit()
        async with running_llmswap(box1) as again:  # the same name: it waits out its predecessor's lease
            await eventually(lambda: all_done(http, again, [task_id]), within=30, what="the task rerunning")
            row = (await tasks_of(http, again))[task_id]
    assert (row["status"], row["host"], row["preemptions"]) == ("completed", "box1", 1)


async def test_two_hosts_racing_for_500_tasks_run_each_once(tmp_path: Path, pg_db: PostgresDb) -> None:
    box1 = host_config(tmp_path, "box1", pg_db.url, {"letters": "a"}, {"a": demo_model("a")})
    box2 = host_config(tmp_path, "box2", pg_db.url, {"letters": "a"}, {"a": demo_model("a")})
    async with (running_llmswap(box1) as one, running_llmswap(box2) as two,
                aiohttp.ClientSession() as http):
        await eventually(lambda: _joined(http, one, 2), within=20, what="both hosts joined")
        body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 4}
        ids = await asyncio.to_thread(db.insert_tasks, pg_db, [("letters", n, body) for n in range(500)])
        await eventually(lambda: all_done(http, one, ids), within=120, what="500 tasks finishing")
        rows = await tasks_of(http, two)
        generated = [await _tokens_generated(http, host) for host in (one, two)]
    assert all(rows[i]["status"] == "completed" and rows[i]["preemptions"] == 0 for i in ids)
    by_host = {h: sum(1 for i in ids if rows[i]["host"] == h) for h in ("box1", "box2")}
    assert by_host["box1"] > 0 and by_host["box2"] > 0
    # Each upstream generated 4 tokens per task it answered: 500 answers in all, none twice.
    assert sum(generated) == 4 * 500, (generated, by_host)


async def _joined(http: aiohttp.ClientSession, host: LlmswapProcess, count: int) -> bool:
    async with http.get(f"{host.url}/api/tasks/stats") as response:
        return sum(1 for h in (await response.json()).get("hosts", []) if h["live"]) == count


async def _tokens_generated(http: aiohttp.ClientSession, host: LlmswapProcess) -> int:
    async with http.get(f"{host.url}/upstream/a/props") as response:
        assert response.status == 200, await response.text()
        return int((await response.json())["demo"]["tokens_generated"])


async def test_while_the_database_is_down_tasks_answer_503_models_serve_and_nothing_is_lost(
    tmp_path: Path, cluster: Cluster
) -> None:
    """The database stops while a task runs: submissions get 503 with Retry-After, models still answer, and
    once it is back the running task's result is recorded (its lease outlived the outage) and the queue
    takes work again."""
    bin_dir = postgres_bin()
    assert bin_dir is not None
    with running_cluster(bin_dir) as own:  # a cluster of its own: this test stops it
        url = own.fresh_database()
        box1 = host_config(tmp_path, "box1", url, {"letters": "a"}, {"a": demo_model("a", *SLOW)}, lease=30)
        async with running_llmswap(box1) as one, aiohttp.ClientSession() as http:
            first = await submit(http, one, "letters", 0)

            async def running() -> bool:
                return (await tasks_of(http, one))[first]["status"] == "running"

            await eventually(running, within=20, what="a task running")
            own.stop()
            body = {"type": "letters", "params": {"messages": [{"role": "user", "content": "x"}]}}
            async with http.post(f"{one.url}/api/tasks", json=body) as response:
                assert response.status == 503
                assert response.headers["Retry-After"] == "5"
                error = (await response.json())["error"]
            assert "cannot be reached" in error["message"] and "127.0.0.1" in error["message"]
            chat = {"model": "a", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(f"{one.url}/v1/chat/completions", json=chat) as response:
                assert response.status == 200  # the proxy serves models without its queue
            await asyncio.sleep(0.5)  # the task's answer is in by now: its outcome waits for the database
            own.start()

            accepted_ids: list[int] = []

            async def accepted() -> bool:
                async with http.post(f"{one.url}/api/tasks", json=body) as response:
                    if response.status == 201:
                        accepted_ids.append(int((await response.json())["id"]))
                    return response.status == 201

            await eventually(accepted, within=30, what="submissions accepted once the database is back")
            await eventually(lambda: all_done(http, one, [first, *accepted_ids]), within=30,
                             what="the tasks finishing after the outage")
            rows = await tasks_of(http, one)
    row = rows[first]
    assert (row["status"], row["preemptions"], row["host"]) == ("completed", 0, "box1")
    assert all(rows[i]["status"] == "completed" for i in accepted_ids)


async def test_a_task_queued_anywhere_wakes_the_host_that_serves_it_without_waiting_for_a_heartbeat(
    tmp_path: Path, pg_db: PostgresDb
) -> None:
    """With a 90 s lease the heartbeat (and its re-read of the queue) comes every 30 s: a task written
    straight into the database (as `llmswap tasks submit` on another machine does) runs well before that,
    because its NOTIFY wakes the host."""
    box1 = host_config(tmp_path, "box1", pg_db.url, {"letters": "a"}, {"a": demo_model("a")}, lease=90)
    async with running_llmswap(box1) as one, aiohttp.ClientSession() as http:
        await eventually(lambda: _joined(http, one, 1), within=20, what="box1 joined")
        await asyncio.sleep(0.5)  # past the wake-up that follows the join
        body = {"messages": [{"role": "user", "content": "from afar"}], "max_tokens": 4}
        task_id, _ = await asyncio.to_thread(db.insert_task, pg_db, "letters", 0, body, dedupe=False)
        await eventually(lambda: all_done(http, one, [task_id]), within=15, what="the woken host running it")


async def test_a_task_cancelled_on_one_host_never_runs_on_the_host_that_holds_it_queued(
    tmp_path: Path, pg_db: PostgresDb
) -> None:
    box0 = host_config(tmp_path, "box0", pg_db.url, {}, {"z": demo_model("z")})
    box1 = host_config(tmp_path, "box1", pg_db.url, {"letters": "a"}, {"a": demo_model("a", *SLOW)})
    async with (running_llmswap(box0) as zero, running_llmswap(box1) as one,
                aiohttp.ClientSession() as http):
        await eventually(lambda: _joined(http, zero, 2), within=20, what="both hosts joined")
        ids = [await submit(http, zero, "letters", n) for n in range(4)]

        async def first_running() -> bool:
            return (await tasks_of(http, zero))[ids[0]]["status"] == "running"

        await eventually(first_running, within=20, what="box1 running the first task")
        for task_id in ids[2:]:
            async with http.delete(f"{zero.url}/api/tasks/{task_id}") as response:
                assert response.status == 200, await response.text()
        await eventually(lambda: all_done(http, zero, ids), within=30, what="every task finishing")
        rows = await tasks_of(http, one)
        answered = await _tokens_generated(http, one) // 4
    assert [rows[i]["status"] for i in ids] == ["completed", "completed", "failed", "failed"]
    assert {rows[i]["error"] for i in ids[2:]} == {"cancelled"}
    assert answered == 2  # the cancelled tasks never reached the model


async def test_a_host_started_before_its_database_joins_once_the_database_is_up(
    tmp_path: Path, cluster: Cluster
) -> None:
    """The database is down when llmswap starts (a fresh database: no tables yet): llmswap serves, answers
    task requests with 503, and once PostgreSQL is up it makes the tables, joins and runs the queue."""
    bin_dir = postgres_bin()
    assert bin_dir is not None
    with running_cluster(bin_dir) as own:
        url = own.fresh_database()
        own.stop()
        box1 = host_config(tmp_path, "box1", url, {"letters": "a"}, {"a": demo_model("a")}, lease=3)
        async with running_llmswap(box1) as one, aiohttp.ClientSession() as http:
            body = {"type": "letters", "params": {"messages": [{"role": "user", "content": "x"}]}}
            async with http.post(f"{one.url}/api/tasks", json=body) as response:
                assert response.status == 503, await response.text()
            # Served before the database was even tried to the end: the outage is told after listening.
            warned = await one.wait_for_output("the shared queue's database", within=30)
            lines = one.stdout_lines + one.stderr_lines
            listening = next(i for i, line in enumerate(lines) if "listening on" in line)
            assert listening < lines.index(warned) and "cannot be reached" in warned
            own.start()
            await eventually(lambda: _joined(http, one, 1), within=30,
                             what="box1 joining once the database is up")
            task_id = await submit(http, one, "letters", 0)
            await eventually(lambda: all_done(http, one, [task_id]), within=20, what="the task running")
            assert (await tasks_of(http, one))[task_id]["status"] == "completed"
            await one.wait_for_output("the shared queue's database", within=5)
            output = one.stdout_lines + one.stderr_lines
            told = [line for line in output if "tasks: the shared queue's database" in line]
            # One line as the outage began, one as it ended: not one per attempt (the requests it refused
            # meanwhile each have their own line), nothing from psycopg's pool.
            assert len(told) == 2 and "answers again" in told[1], "\n".join(told)
            assert not [line for line in output if "psycopg" in line or "llmswap-tasks" in line]


async def test_a_host_stopped_with_sigterm_hands_its_running_task_back_at_once(
    tmp_path: Path, pg_db: PostgresDb
) -> None:
    """A graceful stop waits 5 s for the task in hand; one still running then goes back to the queue at
    once (not after the 60 s lease), its attempt not counted (llmswap stopped it, not the task's fault),
    and the host leaves the hosts table."""
    crawl = ("--tokens-per-second", "1")  # a 20-token answer takes 20 s: longer than the stop waits
    box1 = host_config(tmp_path, "box1", pg_db.url, {"letters": "a"},
                       {"a": demo_model("a", *crawl)}, lease=60)
    box2 = host_config(tmp_path, "box2", pg_db.url, {"letters": "a"}, {"a": demo_model("a")}, lease=60)
    async with running_llmswap(box1) as one, aiohttp.ClientSession() as http:
        body = {"type": "letters", "params": {"messages": [{"role": "user", "content": "long"}],
                                              "max_tokens": 20}}
        async with http.post(f"{one.url}/api/tasks", json=body) as response:
            task_id = int((await response.json())["id"])

        async def running() -> bool:
            return (await tasks_of(http, one))[task_id]["status"] == "running"

        await eventually(running, within=20, what="box1 running the long task")
        assert await stop_with(one) == 0
    async with running_llmswap(box2) as two, aiohttp.ClientSession() as http:
        await eventually(lambda: all_done(http, two, [task_id]), within=30, what="box2 running it")
        row = (await tasks_of(http, two))[task_id]
        async with http.get(f"{two.url}/api/tasks/stats") as response:
            hosts = [h["name"] for h in (await response.json())["hosts"]]
    assert (row["status"], row["host"], row["preemptions"]) == ("completed", "box2", 0), row
    assert hosts == ["box2"]
