"""Every benchmark, one command, one table: `python -m bench` (or `make bench`).

Each row puts llmswap next to a baseline measured (or, for llama-swap's health-check schedule and the FIFO
scheduler, computed) in the same run, and gives their ratio. Progress goes to stderr; the table, the machine
and the command go to stdout as markdown, ready for docs/benchmarks.md. Asserts nothing; `--quick` is a smoke
run with far fewer samples (its numbers are noisy).

Rows and where they come from:
- cold-start overhead: bench.cold_start's measured cold starts of the demo upstream, against llama-swap's
  250 ms + 1 s polling applied to the same ready times;
- warm added latency, throughput, proxy RSS: bench.proxy_overhead's minimal upstream, direct and through a
  real llmswap; RSS of the llmswap process (psutil) against that upstream's, a bare aiohttp server;
- recording cost: bench.recording_cost, the same llmswap with activity and captures on and off;
- streaming relay: bench.relay, a long SSE stream from the unpaced demo upstream;
- interleaved multi-model trace: bench.sim, the batch scheduler against FIFO on the same trace;
- real llama.cpp upstream: bench.llamacpp, llama.cpp's llama-server on a generated GGUF model (the swap
  penalty of conversations is bench.swap_penalty, run on its own);
- beside llama-swap: bench.beside_llama_swap, llmswap and llama-swap (its binary beside the repository) in
  front of identical minimal upstreams: added latency p50/p99, 64 concurrent streams' chunks per second, and
  llmswap's CPU per request against a bare aiohttp proxy's;
- throughput under concurrency: bench.wrk_nginx, wrk against nginx directly and through llmswap at 1, 16, 64
  and 256 connections (nginx and wrk from Debian's packages, installed by the benchmark when missing).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil

from bench import beside_llama_swap, cold_start, proxy_overhead, recording_cost, wrk_nginx
from bench.launch import HOST, PeakRss, free_port, running_llmswap
from bench.llamacpp import llama_cpp_tokens, llama_cpp_version
from bench.proxy_overhead import Side
from bench.relay import streaming_relay
from bench.report import Row, markdown_table, mib, ms, per_second, ratio
from bench.report import machine as describe_machine
from bench.sim.run import simulate
from bench.sim.traces import interleaved_burst
from llmswap.config.model import BatchSettings


@dataclass(frozen=True)
class Scale:
    """How many samples each part takes."""

    cold_starts: int
    cold_start_max_delay: float
    latency_requests: int  # sequential, per side and kind (whole and streamed)
    throughput_requests: int  # per round and side, 3 rounds
    concurrency: int
    relay_tokens: int
    relay_rounds: int
    llama_tokens: int
    llama_rounds: int
    wrk_seconds: float  # per wrk run, each side and connection count
    wrk_rounds: int  # runs of each side at each connection count


FULL = Scale(cold_starts=20, cold_start_max_delay=3.0, latency_requests=2000, throughput_requests=4000,
             concurrency=32, relay_tokens=20_000, relay_rounds=20, llama_tokens=256, llama_rounds=8,
             wrk_seconds=4.0, wrk_rounds=3)
QUICK = Scale(cold_starts=3, cold_start_max_delay=0.5, latency_requests=100, throughput_requests=300,
              concurrency=16, relay_tokens=2_000, relay_rounds=2, llama_tokens=16, llama_rounds=1,
              wrk_seconds=1.0, wrk_rounds=1)


def progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


async def cold_start_rows(scale: Scale) -> list[Row]:
    low = 0.1
    step = (scale.cold_start_max_delay - low) / max(1, scale.cold_starts - 1)
    starts = [await cold_start.one_cold_start(low + i * step) for i in range(scale.cold_starts)]
    ours = [s.overhead for s in starts]
    theirs = [s.llama_swap_overhead for s in starts]

    def median_p90(values: list[float]) -> tuple[float, float]:
        return statistics.median(values), cold_start.percentile(values, 0.9)

    (our_median, our_p90), (their_median, their_p90) = median_p90(ours), median_p90(theirs)
    return [Row(f"cold-start overhead: upstream ready → llmswap notices, median / p90 of {scale.cold_starts}",
                "llama-swap's schedule (250 ms, then polls every 1 s)",
                f"{ms(their_median)} / {ms(their_p90)}", f"{ms(our_median)} / {ms(our_p90)}",
                f"{ratio(our_median, their_median)} / {ratio(our_p90, their_p90)}")]


async def overhead_rows(scale: Scale) -> list[Row]:
    """Warm latency and throughput via llmswap vs direct, and llmswap's memory, on one minimal upstream."""
    with tempfile.TemporaryDirectory() as folder:
        port = free_port()
        direct_url = f"http://{HOST}:{port}"
        config = proxy_overhead.write_config(Path(folder), "raw", port, scale.concurrency)
        async with running_llmswap(config, [f"{direct_url}/health"]) as server:
            (upstream_pid,) = server.upstream_pids()
            idle = {"llmswap": server.rss(), "upstream": psutil.Process(upstream_pid).memory_info().rss}
            connector = aiohttp.TCPConnector(limit=scale.concurrency)
            async with aiohttp.ClientSession(connector=connector) as http:
                warm_up = [Side("direct", direct_url), Side("llmswap", server.url)]
                await proxy_overhead.latency_phase(http, warm_up, max(20, scale.latency_requests // 10))
                direct, proxied = Side("direct", direct_url), Side("llmswap", server.url)
                await proxy_overhead.latency_phase(http, [direct, proxied], scale.latency_requests)
                async with PeakRss({"llmswap": server.pid, "upstream": upstream_pid}) as loaded:
                    await proxy_overhead.throughput_phase(http, [direct, proxied], scale.throughput_requests,
                                                          scale.concurrency)

    rows = []
    for q in (50, 99):
        base, ours = (proxy_overhead.percentile(side.latencies, q) for side in (direct, proxied))
        rows.append(Row(f"warm latency p{q}: whole chat completion, {scale.latency_requests} sequential",
                        "direct to the upstream", ms(base), ms(ours),
                        f"{ratio(ours, base)} ({(ours - base) * 1000:+.2f} ms)"))
    base, ours = (statistics.median(side.throughputs) for side in (direct, proxied))
    rows.append(Row(f"throughput: {scale.concurrency} requests in flight, median of 3 rounds",
                    "direct to the upstream", per_second(base, "req"), per_second(ours, "req"),
                    ratio(ours, base)))
    against = "the upstream: a bare aiohttp server, same Python"
    rows.append(Row("proxy RSS, idle (model loaded, no request yet)", against, mib(idle["upstream"]),
                    mib(idle["llmswap"]), ratio(idle["llmswap"], idle["upstream"])))
    rows.append(Row("proxy RSS under load: peak during the throughput rounds", against,
                    mib(loaded.peaks["upstream"]), mib(loaded.peaks["llmswap"]),
                    ratio(loaded.peaks["llmswap"], loaded.peaks["upstream"])))
    return rows


async def recording_rows(scale: Scale) -> list[Row]:
    """Activity and captures on against off, same llmswap, same run."""
    return await recording_cost.recording_rows(scale.latency_requests // 2, scale.throughput_requests // 2,
                                               scale.concurrency)


async def trace_rows(_: Scale) -> list[Row]:
    """The batch scheduler against FIFO on the interleaved trace; a simulation, so exact and instant."""
    trace = interleaved_burst()
    fifo, batch = simulate(trace, "fifo"), simulate(trace, "batch", batch=BatchSettings())
    name = "interleaved multi-model trace, one model loaded at a time"
    against = "FIFO scheduler (llama-swap's order)"
    return [
        Row(f"{name}: swaps", against, str(fifo.swaps), f"{batch.swaps} (batch scheduler)",
            ratio(batch.swaps, fifo.swaps)),
        Row(f"{name}: makespan", against, f"{fifo.makespan:.0f} s", f"{batch.makespan:.0f} s",
            ratio(batch.makespan, fifo.makespan)),
        Row(f"{name}: p99 wait", against, f"{fifo.p99:.1f} s", f"{batch.p99:.1f} s",
            ratio(batch.p99, fifo.p99)),
    ]


async def relay_rows(scale: Scale) -> list[Row]:
    return await streaming_relay(scale.relay_tokens, scale.relay_rounds)


async def llama_rows(scale: Scale) -> list[Row]:
    return await llama_cpp_tokens(scale.llama_tokens, scale.llama_rounds)


async def beside_rows(scale: Scale) -> list[Row]:
    return await beside_llama_swap.measure(scale.latency_requests, beside_llama_swap.IN_FLIGHT,
                                           scale.relay_tokens // 10, scale.wrk_rounds)


async def wrk_rows(scale: Scale) -> list[Row]:
    if (reason := wrk_nginx.ensure_tools()) is not None:
        return [Row.skipped("wrk against nginx: throughput and latency under concurrency", reason)]
    return await wrk_nginx.measure(scale.wrk_seconds, wrk_nginx.CONNECTIONS, rounds=scale.wrk_rounds)


PARTS: list[tuple[str, Callable[[Scale], Awaitable[list[Row]]]]] = [
    ("cold starts", cold_start_rows),
    ("warm latency, throughput and memory", overhead_rows),
    ("beside llama-swap: added latency, 64 streams, CPU per request", beside_rows),
    ("recording cost", recording_rows),
    ("streaming relay", relay_rows),
    ("interleaved trace (simulated)", trace_rows),
    ("real llama.cpp upstream", llama_rows),
    ("wrk against nginx", wrk_rows),
]


async def run(scale: Scale) -> list[Row]:
    rows: list[Row] = []
    for name, part in PARTS:
        began = time.monotonic()
        progress(f"{name}...")
        rows += await part(scale)
        progress(f"{name}: {time.monotonic() - began:.0f} s")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run with few samples (noisy numbers)")
    args = parser.parse_args(argv)
    began = time.monotonic()
    rows = asyncio.run(run(QUICK if args.quick else FULL))
    took = time.monotonic() - began
    versions = [("aiohttp", aiohttp.__version__)]
    if (llama_version := llama_cpp_version()) is not None:
        versions.append(("llama-server", llama_version))
    command = "python -m bench" + (" --quick" if args.quick else "")
    print(f"Machine: {describe_machine(versions)}")
    print(f"Command: `{command}` (took {took / 60:.1f} min)\n")
    print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
