"""Cold-start detection overhead: how long after an upstream can first answer 200 does ensure_ready() return.

Run: `python -m bench.cold_start [--starts 20] [--max-delay 3.0]`. Prints numbers; asserts nothing.

Each start spawns the demo upstream with a different `--startup-delay` (spread evenly from 0.1 s to
`--max-delay`). The instant the upstream could first answer 200 is known exactly: the demo counts its delay
from a start instant this benchmark hands it (a small launcher calls the demo's `main(started_at=...)` and
prints that instant), and it cannot answer before it listens (its "listening on" line, stamped with the
monotonic clock as it arrives in the log ring). So

    upstream ready   = max(started_at + startup delay, arrival of "listening on")
    llmswap overhead = the moment ensure_ready() returned - upstream ready

The demo's own "first healthy response at monotonic=" line marks the probe that succeeded, which is *after*
the upstream became ready by however long the poller waited; the gap between that line and ensure_ready()
returning is printed too (the cost of noticing a 200 once it arrives).

Baseline, same run: llama-swap sleeps 250 ms after spawning, then probes once a second. Applied to the very
same upstream ready times (relative to spawn), its first passing probe is computed, not measured.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import socket
import statistics
import sys
import time
from dataclasses import dataclass

from llmswap.config.model import ModelConfig
from llmswap.process import LogRing, Process

LLAMA_SWAP_FIRST_WAIT = 0.250
LLAMA_SWAP_INTERVAL = 1.0
TARGET_MEDIAN = 0.030

# Runs the demo with a start instant we know: the same thing the demo's __main__ does with its own clock read.
LAUNCHER = """\
import sys, time
started_at = time.monotonic()
print(f"bench: started at monotonic={started_at!r}", flush=True)
from llmswap.demo.main import main
raise SystemExit(main(sys.argv[1:], started_at=started_at))
"""

_STARTED = re.compile(r"^bench: started at monotonic=([0-9.]+)$")
_FIRST_HEALTHY = re.compile(r"first healthy response at monotonic=([0-9.]+)")


@dataclass(frozen=True)
class ColdStart:
    delay: float  # the demo's --startup-delay
    called: float  # ensure_ready() called
    spawned: float  # child spawned
    upstream_ready: float  # the upstream could first answer 200
    first_200: float  # the demo answered its first 200 (the probe that passed)
    returned: float  # ensure_ready() returned

    @property
    def overhead(self) -> float:
        return self.returned - self.upstream_ready

    @property
    def llama_swap_overhead(self) -> float:
        ready_after_spawn = self.upstream_ready - self.spawned
        waits = max(0.0, ready_after_spawn - LLAMA_SWAP_FIRST_WAIT)
        probes_after_the_first = math.ceil(waits / LLAMA_SWAP_INTERVAL)
        first_passing_probe = LLAMA_SWAP_FIRST_WAIT + probes_after_the_first * LLAMA_SWAP_INTERVAL
        return first_passing_probe - ready_after_spawn


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find(ring: LogRing, pattern: re.Pattern[str]) -> tuple[float, float] | None:
    """(arrival time, captured number) of the first line matching `pattern`."""
    for entry in ring.entries():
        if match := pattern.search(entry.line):
            return entry.timestamp, float(match.group(1))
    return None


async def one_cold_start(delay: float) -> ColdStart:
    port = free_port()
    demo_args = ("--port", str(port), "--model-name", "bench", "--startup-delay", f"{delay:.3f}")
    config = ModelConfig(
        id="bench",
        cmd=(sys.executable, "-c", LAUNCHER, *demo_args),
        proxy=f"http://127.0.0.1:{port}",
        health_check_timeout=60.0,
        unload_timeout=2.0,
    )
    ring = LogRing("bench", wall_clock=time.monotonic)  # arrival stamps on the same clock as the rest
    process = Process(config, log_ring=ring)
    try:
        called = time.monotonic()
        await process.ensure_ready()
        returned = time.monotonic()
        assert process.last_start_duration is not None
        spawned = returned - process.last_start_duration
        first_200 = None
        for _ in range(200):  # the demo prints it just after answering; give the pipe a moment
            first_200 = find(ring, _FIRST_HEALTHY)
            if first_200 is not None:
                break
            await asyncio.sleep(0.01)
        started = find(ring, _STARTED)
        listening = next((e.timestamp for e in ring.entries() if "listening on" in e.line), None)
        if started is None or listening is None or first_200 is None:
            raise RuntimeError("the demo did not print its timing lines:\n" + "\n".join(ring.history()))
        upstream_ready = max(started[1] + delay, listening)
        return ColdStart(delay, called, spawned, upstream_ready, first_200[1], returned)
    finally:
        await process.shutdown(timeout=2.0)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = fraction * (len(ordered) - 1)
    low, high = math.floor(index), math.ceil(index)
    return ordered[low] + (ordered[high] - ordered[low]) * (index - low)


def row(label: str, values: list[float]) -> str:
    ms = [value * 1000 for value in values]
    return (
        f"{label:<44} {statistics.median(ms):9.1f} {percentile(ms, 0.9):9.1f} {min(ms):9.1f} {max(ms):9.1f}"
    )


async def run(starts: int, max_delay: float, verbose: bool) -> None:
    low = 0.1
    step = (max_delay - low) / max(1, starts - 1)
    delays = [low + index * step for index in range(starts)]
    results: list[ColdStart] = []
    for delay in delays:
        result = await one_cold_start(delay)
        results.append(result)
        if verbose:
            ready_after_spawn = result.upstream_ready - result.spawned
            print(
                f"delay {delay:5.2f}s  upstream ready {1000 * ready_after_spawn:7.1f} ms "
                f"after spawn  llmswap +{1000 * result.overhead:6.1f} ms  "
                f"llama-swap +{1000 * result.llama_swap_overhead:6.1f} ms",
                flush=True,
            )

    llmswap = [r.overhead for r in results]
    baseline = [r.llama_swap_overhead for r in results]
    print(f"\ncold starts of the demo upstream: {starts}, startup delays {delays[0]:.2f}-{delays[-1]:.2f} s")
    print(f"{'(milliseconds)':<44} {'median':>9} {'p90':>9} {'min':>9} {'max':>9}")
    print(row("llmswap: upstream ready -> ensure_ready()", llmswap))
    print(row("llama-swap schedule, same ready times", baseline))
    print(row("llmswap: ensure_ready() called -> spawned", [r.spawned - r.called for r in results]))
    print(row("llmswap: demo's first 200 -> ensure_ready()", [r.returned - r.first_200 for r in results]))
    median = statistics.median(llmswap)
    ratio = statistics.median(baseline) / median if median > 0 else float("inf")
    verdict = "met" if median < TARGET_MEDIAN else "NOT met"
    print(f"median overhead {1000 * median:.1f} ms vs llama-swap {1000 * statistics.median(baseline):.1f} ms "
          f"({ratio:.0f}x less); target median < {1000 * TARGET_MEDIAN:.0f} ms: {verdict}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cold_start", description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=20, help="number of cold starts (default 20)")
    parser.add_argument("--max-delay", type=float, default=3.0, help="largest --startup-delay, seconds")
    parser.add_argument("--verbose", action="store_true", help="print every start")
    args = parser.parse_args(argv)
    asyncio.run(run(args.starts, args.max_delay, args.verbose))


if __name__ == "__main__":
    main()
