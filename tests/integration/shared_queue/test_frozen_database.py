"""A shared queue's PostgreSQL frozen (SIGSTOP: it takes connections and answers nothing, as a hung or
swapping database server does) while chats and a config reload go on: nothing on llmswap's event loop waits
for it. llmswap runs in asyncio's debug mode with its loop watch (`LLMSWAP_LOOP_WATCH_MS=100`), which logs
every callback that held the loop for 100 ms."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import aiohttp
import psutil

from tests.helpers.cli import LlmswapProcess, demo_model, running_llmswap, write_config
from tests.helpers.postgres import Cluster, postgres_bin, running_cluster
from tests.helpers.wait import eventually

CHAT = {"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
WINDOW = 2.0  # seconds of chats counted with the database up, then frozen


def cluster_processes(cluster: Cluster) -> list[psutil.Process]:
    """The postmaster (the first line of postmaster.pid) and every server process under it."""
    pid = int(Path(cluster.data, "postmaster.pid").read_text().split()[0])
    postmaster = psutil.Process(pid)
    return [postmaster, *postmaster.children(recursive=True)]


async def chats_for(http: aiohttp.ClientSession, host: LlmswapProcess, model: str, seconds: float) -> int:
    """Chats answered one after another for `seconds`; every one must be a 200."""
    answered = 0
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        async with http.post(f"{host.url}/v1/chat/completions", json={"model": model, **CHAT}) as response:
            assert response.status == 200, await response.text()
            await response.read()
        answered += 1
    return answered


async def test_chats_and_a_reload_go_on_while_the_shared_queues_database_is_frozen(tmp_path: Path) -> None:
    bin_dir = postgres_bin()
    assert bin_dir is not None
    with running_cluster(bin_dir) as own:
        url = own.fresh_database()
        tasks = {"db": url, "host": "box1", "types": {"letters": {"model": "a"}}}
        models = {"a": demo_model("a"), "b": demo_model("b")}
        config = write_config(tmp_path / "box1.yaml", {"a": models["a"]}, tasks=tasks)
        env = {"PYTHONASYNCIODEBUG": "1", "LLMSWAP_LOOP_WATCH_MS": "100"}
        async with running_llmswap(config, env=env) as one, aiohttp.ClientSession() as http:
            async def joined() -> bool:
                async with http.get(f"{one.url}/api/hosts") as response:
                    return response.status == 200
            await eventually(joined, within=20, what="llmswap answering")
            await chats_for(http, one, "a", 0.5)  # a is loaded
            before = await chats_for(http, one, "a", WINDOW)

            frozen = cluster_processes(own)
            for process in frozen:
                process.send_signal(signal.SIGSTOP)
            try:
                # A submission waits on the database off the loop (its answer comes once it thaws).
                body = {"type": "letters", "params": {"messages": [{"role": "user", "content": "x"}]}}
                submission = asyncio.create_task(http.post(f"{one.url}/api/tasks", json=body))
                during = await chats_for(http, one, "a", WINDOW)
                # A reload adds b while the database is frozen: b is served through the new router.
                write_config(config, models, tasks=tasks)
                os.kill(one.process.pid, signal.SIGHUP)
                await one.wait_for_output("config reload: applied", within=20)
                await eventually(lambda: _serves(http, one, "b"), within=30, what="b served after the reload")
                after_reload = await chats_for(http, one, "b", WINDOW)
            finally:
                for process in frozen:
                    process.send_signal(signal.SIGCONT)
            async with await submission as response:
                assert response.status in (201, 503), await response.text()
        output = one.stdout_lines + one.stderr_lines
    # As many chats as before, give or take the machine's noise: none waited on the frozen database.
    assert during >= before / 2 and after_reload >= before / 2, (before, during, after_reload)
    assert any("watching the event loop" in line for line in output)
    slow = [line for line in output if "slow callback:" in line]
    assert slow == [], "\n".join(slow)


async def _serves(http: aiohttp.ClientSession, host: LlmswapProcess, model: str) -> bool:
    async with http.post(f"{host.url}/v1/chat/completions", json={"model": model, **CHAT}) as response:
        await response.read()
        return response.status == 200
