"""Swaps that sleep against swaps that stop: A, B, A, B... with two demo upstreams speaking vLLM's sleep API,
one model at a time, the same llmswap with and without `sleep:`/`wake:` in the same run.

    python -m bench.sleep_swap [--start 2] [--wake 0.2] [--rounds 3]

The demo's start and wake delays stand for a real server's (vLLM: minutes to start, about 1.6 s to wake,
as llama-swap's vllm-wrapper measured); what is measured is what llmswap adds around them: the sleep and
wake calls, the scheduling, and a swap that no longer waits for a start. Rows: the median and the worst time
of a request that swapped, with sleep against with stop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.launch import free_port, running_llmswap
from bench.report import Row, markdown_table, ms, ratio
from bench.report import machine as describe_machine


def config(folder: Path, start: float, wake: float, *, sleep: bool) -> Path:
    demo = (f"{sys.executable} -m llmswap.demo --port ${{PORT}} --enable-sleep-mode --startup-delay {start} "
            f"--wake-delay {wake}")
    calls = {"sleep": "POST /sleep?level=1&mode=wait", "wake": "POST /wake_up"} if sleep else {}
    path = folder / ("sleep.yaml" if sleep else "stop.yaml")
    path.write_text(json.dumps({
        "healthCheckTimeout": 60, "startPort": free_port(),
        "models": {name: {"cmd": f"{demo} --model-name {name}", **calls} for name in ("a", "b")},
    }))
    return path


async def swaps(url: str, rounds: int) -> list[float]:
    """Seconds of every request after the first two (each swaps A and B), over `rounds` A-B rounds."""
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    took: list[float] = []
    async with aiohttp.ClientSession() as http:
        for index in range(2 + 2 * rounds):
            began = time.monotonic()
            request = {**body, "model": "ab"[index % 2]}
            async with http.post(f"{url}/v1/chat/completions", json=request) as answer:
                assert answer.status == 200, await answer.text()
            if index >= 2:
                took.append(time.monotonic() - began)
    return took


async def main(start: float, wake: float, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="llmswap-sleep-swap-") as temporary:
        folder = Path(temporary)
        results = {}
        for sleep in (False, True):
            print("sleep..." if sleep else "stop...", file=sys.stderr)
            async with running_llmswap(config(folder, start, wake, sleep=sleep), []) as server:
                results[sleep] = await swaps(server.url, rounds)
    stop, sleep = results[False], results[True]
    against = "the same llmswap, models stopped (no sleep:), same run"
    label = "swap A<->B, sleep instead of stop"
    median_stop, median_sleep = statistics.median(stop), statistics.median(sleep)
    rows = [
        Row(f"{label}: median of {len(sleep)}", against, ms(median_stop), ms(median_sleep),
            ratio(median_sleep, median_stop)),
        Row(f"{label}: worst of {len(sleep)}", against, ms(max(stop)), ms(max(sleep)),
            ratio(max(sleep), max(stop))),
    ]
    print(f"sleep swaps: demo start {start:g} s, wake {wake:g} s, {rounds} rounds\n\n"
          f"machine: {describe_machine()}\n")
    print(markdown_table(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", type=float, default=2.0, help="the demo's start delay, seconds")
    parser.add_argument("--wake", type=float, default=0.2, help="the demo's wake delay, seconds")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    asyncio.run(main(options.start, options.wake, options.rounds))
