"""llmswap beside llama-swap in one run: the latency each adds to a warm request, the chunks per second of 64
concurrent streams through each, and llmswap's CPU per request against a bare aiohttp proxy's.

Run: `python -m bench.beside_llama_swap [--requests 2000] [--streams 64] [--chunks 2000] [--rounds 3]`.
Prints a markdown table; asserts nothing. `python -m bench` runs it as one of its parts.

One minimal upstream (`bench.proxy_overhead`'s raw aiohttp server: a fixed chat completion, or a stream of
as many chunks as `max_tokens` asks, as fast as the socket takes them) is started by llmswap and preloaded;
llama-swap (`../shared/bin/llama-swap` beside the repository, else one on PATH) starts an identical one of
its own, on another port, and a bare aiohttp proxy (`bench.bare_proxy`) stands in front of llmswap's. Every
figure is read against the upstream hit directly in the same rounds:

- added latency p50 and p99: sequential whole chat completions, in blocks that alternate the sides, minus
  the direct request's time at the same percentile;
- 64 concurrent streams: `--streams` clients each reading a `--chunks`-chunk stream at once, in rounds that
  alternate the sides; a side's chunks per second is its median round;
- CPU per warm request: llmswap's process CPU time over the throughput rounds of 64 requests in flight,
  against the bare proxy's over the same rounds (the floor of a Python proxy on aiohttp).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil

from bench import proxy_overhead
from bench.launch import HOST, find_llama_swap, free_port, running_llmswap, running_process
from bench.report import Row, ms, per_second, print_report, ratio

MODEL = proxy_overhead.MODEL
BLOCK = 100  # sequential requests per side before the next side's turn
IN_FLIGHT = 64


@dataclass
class Side:
    name: str
    url: str
    pid: int | None = None  # the proxy's process, for its CPU time
    latencies: list[float] = field(default_factory=list)
    chunk_rates: list[float] = field(default_factory=list)
    cpu_per_request: list[float] = field(default_factory=list)


def upstream_command(port: int) -> str:
    return f"{sys.executable} -m bench.proxy_overhead --serve-upstream --port {port}"


def model_entry(port: int) -> dict[str, object]:
    return {"cmd": upstream_command(port), "proxy": f"http://{HOST}:{port}", "concurrencyLimit": 256}


async def one_stream(http: aiohttp.ClientSession, url: str, chunks: int) -> int:
    """Read one `chunks`-chunk stream whole; the content chunks it carried."""
    body = {**proxy_overhead.STREAM_CHAT, "max_tokens": chunks}
    seen = 0
    async with http.post(f"{url}/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise SystemExit(f"{url}: status {response.status}")
        async for line in response.content:
            if line.startswith(b"data: {") and b'"content"' in line:
                seen += 1
    return seen


async def streams_round(http: aiohttp.ClientSession, side: Side, streams: int, chunks: int) -> None:
    began = time.perf_counter()
    counts = await asyncio.gather(*(one_stream(http, side.url, chunks) for _ in range(streams)))
    side.chunk_rates.append(sum(counts) / (time.perf_counter() - began))


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


async def cpu_round(http: aiohttp.ClientSession, side: Side, requests: int) -> None:
    """`requests` whole chat completions, `IN_FLIGHT` at a time; the proxy's CPU time per request."""
    assert side.pid is not None
    remaining = requests

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await proxy_overhead.one_request(http, side.url)

    before = cpu_seconds(side.pid)
    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    side.cpu_per_request.append((cpu_seconds(side.pid) - before) / requests)


async def measure(requests: int, streams: int, chunks: int, rounds: int) -> list[Row]:
    llama_swap = find_llama_swap()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        ours, theirs = free_port(), free_port()
        direct_url = f"http://{HOST}:{ours}"
        config = folder / "llmswap.yaml"
        config.write_text(json.dumps({"healthCheckTimeout": 30, "models": {MODEL: model_entry(ours)},
                                      "hooks": {"on_startup": {"preload": [MODEL]}}}))
        async with running_llmswap(config, [f"{direct_url}/health"]) as server:
            bare_port = free_port()
            bare_url = f"http://{HOST}:{bare_port}"
            async with running_process([sys.executable, "-m", "bench.bare_proxy", str(bare_port), direct_url],
                                       [f"{bare_url}/health"], folder / "bare.log") as bare:
                direct = Side("direct to the upstream", direct_url)
                llmswap = Side("llmswap", server.url, server.pid)
                bare_side = Side("bare aiohttp proxy", bare_url, bare.pid)
                sides = [direct, llmswap]
                if llama_swap is None:
                    return await _rounds(sides, bare_side, None, requests, streams, chunks, rounds)
                swap_port = free_port()
                swap_config = folder / "llama-swap.yaml"
                swap_config.write_text(json.dumps({"healthCheckTimeout": 30,
                                                   "models": {MODEL: model_entry(theirs)},
                                                   "hooks": {"on_startup": {"preload": [MODEL]}}}))
                swap_url = f"http://{HOST}:{swap_port}"
                command = [llama_swap, "-config", str(swap_config), "-listen", f"{HOST}:{swap_port}"]
                async with running_process(command, [f"{swap_url}/health", f"http://{HOST}:{theirs}/health"],
                                           folder / "llama-swap.log") as swap:
                    theirs_side = Side("llama-swap", swap_url, swap.pid)
                    return await _rounds([*sides, theirs_side], bare_side, theirs_side, requests, streams,
                                         chunks, rounds)


async def _rounds(sides: list[Side], bare: Side, llama_swap: Side | None, requests: int, streams: int,
                  chunks: int, rounds: int) -> list[Row]:
    direct, llmswap = sides[0], sides[1]
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        warm = [Side(s.name, s.url) for s in sides]
        await latency(http, warm, max(50, requests // 10))
        await latency(http, sides, requests)
        for index in range(rounds):
            for side in sides if index % 2 == 0 else list(reversed(sides)):
                await streams_round(http, side, streams, chunks)
            for side in (llmswap, bare) if index % 2 == 0 else (bare, llmswap):
                await cpu_round(http, side, requests)
    return rows(direct, llmswap, bare, llama_swap, requests, streams, chunks)


async def latency(http: aiohttp.ClientSession, sides: list[Side], requests: int) -> None:
    for block in range(0, requests, BLOCK):
        for side in sides if block // BLOCK % 2 == 0 else list(reversed(sides)):
            for _ in range(min(BLOCK, requests - block)):
                side.latencies.append(await proxy_overhead.one_request(http, side.url))


def rows(direct: Side, llmswap: Side, bare: Side, llama_swap: Side | None, requests: int, streams: int,
         chunks: int) -> list[Row]:
    table: list[Row] = []
    for q in (50, 99):
        base = proxy_overhead.percentile(direct.latencies, q)
        ours = proxy_overhead.percentile(llmswap.latencies, q) - base
        measure = f"added latency p{q}: whole chat completion, {requests} sequential, minus direct"
        if llama_swap is None:
            table.append(Row.skipped(measure, "no llama-swap binary beside the repository or on PATH"))
            continue
        theirs = proxy_overhead.percentile(llama_swap.latencies, q) - base
        table.append(Row(measure, "llama-swap, same upstream, same run", ms(theirs), ms(ours),
                         ratio(ours, theirs)))
    measure = f"{streams} concurrent streams of {chunks} chunks: chunks per second, median round"
    ours = statistics.median(llmswap.chunk_rates)
    if llama_swap is None:
        table.append(Row.skipped(measure, "no llama-swap binary beside the repository or on PATH"))
    else:
        theirs = statistics.median(llama_swap.chunk_rates)
        table.append(Row(measure, "llama-swap, same run", per_second(theirs, "chunk"),
                         per_second(ours, "chunk"), ratio(ours, theirs)))
    direct_rate = statistics.median(direct.chunk_rates)
    table.append(Row(measure, "direct to the upstream", per_second(direct_rate, "chunk"),
                     per_second(ours, "chunk"), ratio(ours, direct_rate)))
    ours_cpu, floor = statistics.median(llmswap.cpu_per_request), statistics.median(bare.cpu_per_request)
    table.append(Row(f"CPU per warm request, {IN_FLIGHT} in flight: the proxy process's user+system time",
                     "bare aiohttp proxy (bench.bare_proxy), same run", f"{floor * 1e6:.0f} us",
                     f"{ours_cpu * 1e6:.0f} us", ratio(ours_cpu, floor)))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.beside_llama_swap",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="sequential requests per side")
    parser.add_argument("--streams", type=int, default=IN_FLIGHT, help="concurrent streams per round")
    parser.add_argument("--chunks", type=int, default=2000, help="chunks per stream")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of streams and CPU per side")
    args = parser.parse_args(argv)
    began = time.monotonic()
    table = asyncio.run(measure(args.requests, args.streams, args.chunks, args.rounds))
    print_report(table, "python -m bench.beside_llama_swap", began)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
