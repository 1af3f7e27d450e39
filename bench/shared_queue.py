"""Tasks of two types through one PostgreSQL queue: two hosts, each serving one type, against one host
serving both, in the same run.

    python -m bench.shared_queue [--tasks 200] [--start 1.0] [--tokens-per-second 200]

Each run gets a fresh database on a throwaway PostgreSQL cluster (tests/helpers/postgres.py: the
distribution's server, installed by .ci/run). The tasks are written straight into the queue at once,
half `letters` (model a), half `research` (model b), interleaved; the makespan runs from that write until
every row is finished. On one host the two demo models take turns (one at a time, each start costing
--start seconds); with two hosts each serves its own type and nothing swaps. "Run twice" counts the
answers the upstreams generated beyond one per task (the demo's own counter; in the two-host run no
upstream restarts, so the counter sees everything) plus the rows that were claimed more than once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.launch import Llmswap, free_port, running_llmswap
from bench.report import Row, markdown_table, ms, ratio
from bench.report import machine as describe_machine
from llmswap.tasks.queue import db
from llmswap.tasks.queue.sql import PostgresDb
from tests.helpers.postgres import Cluster, postgres_bin, running_cluster

MAX_TOKENS = 8
TYPES = {"letters": "a", "research": "b"}


def host_config(folder: Path, name: str, url: str, types: dict[str, str], start: float, rate: float) -> Path:
    folder.mkdir(parents=True)
    demo = (f"{sys.executable} -m llmswap.demo --port ${{PORT}} --startup-delay {start} "
            f"--tokens-per-second {rate}")
    models = sorted(set(types.values()))
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps({
        "healthCheckTimeout": 60, "startPort": free_port(),
        "models": {m: {"cmd": f"{demo} --model-name {m}"} for m in models},
        "tasks": {"db": url, "host": name, "leaseSeconds": 10, "maxQueueDepth": 10_000,
                  "types": {t: {"model": m} for t, m in types.items()}},
    }))
    return path


async def drain(cluster: Cluster, folder: Path, hosts: dict[str, dict[str, str]], tasks: int, start: float,
                rate: float) -> tuple[float, int, int]:
    """Start the hosts on a fresh database, queue the tasks, wait until all are finished: (makespan,
    rows claimed more than once, answers beyond one per task as the upstreams count them)."""
    url = cluster.fresh_database()
    database = PostgresDb(url)
    db.init_db(database)
    async with contextlib.AsyncExitStack() as stack:
        running = {
            name: await stack.enter_async_context(
                running_llmswap(host_config(folder / name, name, url, types, start, rate), []))
            for name, types in hosts.items()
        }
        await _wait_joined(running, len(hosts))
        body = {"messages": [{"role": "user", "content": "work"}], "max_tokens": MAX_TOKENS}
        rows = [(task_type, n, body) for n in range(tasks // 2) for task_type in TYPES]
        began = time.monotonic()
        await asyncio.to_thread(db.insert_tasks, database, rows)
        while True:
            counts = await asyncio.to_thread(db.task_stats, database)
            if sum(c["completed"] + c["failed"] for c in counts.values()) >= len(rows):
                break
            await asyncio.sleep(0.05)
        makespan = time.monotonic() - began
        generated = await _answers(running, hosts)
    finished = db.list_tasks(database, limit=len(rows) + 1)
    database.close()
    failed = [r for r in finished if r.status != "completed"]
    if failed:
        raise SystemExit(f"{len(failed)} task(s) failed, e.g. {failed[0].error}")
    reclaimed = sum(1 for r in finished if r.preemptions)
    return makespan, reclaimed, generated - len(rows)


async def _wait_joined(running: dict[str, Llmswap], count: int) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(400):
            async with http.get(f"{next(iter(running.values())).url}/api/tasks/stats") as answer:
                hosts = (await answer.json()).get("hosts", [])
            if sum(1 for h in hosts if h["live"]) == count:
                return
            await asyncio.sleep(0.05)
    raise SystemExit("the hosts did not join the shared queue")


async def _answers(running: dict[str, Llmswap], hosts: dict[str, dict[str, str]]) -> int:
    """Answers the running upstreams generated (tokens / MAX_TOKENS); a swapped-out one's are gone."""
    total = 0
    async with aiohttp.ClientSession() as http:
        for name, server in running.items():
            for model in sorted(set(hosts[name].values())):
                async with http.get(f"{server.url}/upstream/{model}/props") as answer:
                    if answer.status == 200:
                        total += int((await answer.json())["demo"]["tokens_generated"]) // MAX_TOKENS
    return total


async def main(tasks: int, start: float, rate: float) -> None:
    bin_dir = postgres_bin()
    if bin_dir is None:
        raise SystemExit("PostgreSQL's server is not installed (apt-get install postgresql)")
    with running_cluster(bin_dir) as cluster, tempfile.TemporaryDirectory(prefix="llmswap-shared-") as tmp:
        print("one host serving both types...", file=sys.stderr)
        one, _, _ = await drain(cluster, Path(tmp) / "one", {"box": TYPES}, tasks, start, rate)
        print("two hosts, one type each...", file=sys.stderr)
        split = {"box1": {"letters": "a"}, "box2": {"research": "b"}}
        two, reclaimed, extra = await drain(cluster, Path(tmp) / "two", split, tasks, start, rate)
    against = "the same tasks on one host serving both types, same run"
    rows = [
        Row(f"{tasks} tasks, 2 types, 2 hosts on one PostgreSQL queue: makespan", against, ms(one), ms(two),
            ratio(two, one)),
        Row("tasks run twice (two hosts)", "must be 0", "0", str(extra + reclaimed), "-"),
    ]
    print(f"shared queue: demo start {start:g} s, {rate:g} tokens/s, {MAX_TOKENS} tokens a task\n\n"
          f"machine: {describe_machine()}\n")
    print(markdown_table(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--start", type=float, default=1.0, help="the demo's start delay, seconds")
    parser.add_argument("--tokens-per-second", type=float, default=200.0)
    options = parser.parse_args()
    asyncio.run(main(options.tasks, options.start, options.tokens_per_second))
