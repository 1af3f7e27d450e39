"""What the keeper costs an upstream's start: the demo upstream spawned and probed until /health answers
200, with its keeper and without, alternating so both see the same machine. Also the keeper's own spawn
time (the only part on llmswap's event loop) and its resident memory.

Run: `python -m bench.keeper_cost [--starts 20]`. Prints numbers and the ratio; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import statistics
import sys
import time

import aiohttp
import psutil

from llmswap.process.child import spawn_child
from llmswap.process.keeper import start_keeper


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def one_start(http: aiohttp.ClientSession, keeper: bool) -> float:
    """Seconds from spawn to the first 200 of /health."""
    port = free_port()
    argv = [sys.executable, "-m", "llmswap.demo", "--port", str(port), "--model-name", "bench"]
    began = time.monotonic()
    child = await spawn_child(argv, env={}, on_line=lambda line: None, keeper=keeper)
    try:
        while True:
            try:
                async with http.get(f"http://127.0.0.1:{port}/health") as response:
                    if response.status == 200:
                        return time.monotonic() - began
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.005)
    finally:
        child.signal_group(signal.SIGKILL)
        await child.wait_exit(10)
        await child.close(1.0)


def keeper_spawn() -> tuple[float, int]:
    """(seconds start_keeper blocks the caller, the keeper's RSS in bytes once it settled)."""
    guarded = psutil.Popen(["sleep", "60"], start_new_session=True)
    try:
        began = time.monotonic()
        keeper = start_keeper(guarded.pid)
        spawn = time.monotonic() - began
        assert keeper is not None
        time.sleep(0.3)
        rss = psutil.Process(keeper.pid).memory_info().rss
        keeper.stand_down()
        return spawn, rss
    finally:
        guarded.kill()
        guarded.wait()


async def main(starts: int) -> None:
    with_keeper: list[float] = []
    without: list[float] = []
    async with aiohttp.ClientSession() as http:
        for _ in range(starts):
            without.append(await one_start(http, keeper=False))
            with_keeper.append(await one_start(http, keeper=True))
    spawns, rss = zip(*(keeper_spawn() for _ in range(5)), strict=True)
    a, b = statistics.median(without), statistics.median(with_keeper)
    print(f"demo start to first 200, median of {starts}: without keeper {a * 1000:.1f} ms, "
          f"with keeper {b * 1000:.1f} ms, ratio {b / a:.3f}")
    print(f"start_keeper blocks the caller (median of 5): {statistics.median(spawns) * 1000:.2f} ms; "
          f"keeper RSS {statistics.median(rss) / 2**20:.1f} MiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--starts", type=int, default=20)
    asyncio.run(main(parser.parse_args().starts))
