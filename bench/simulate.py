"""Swap-aware batching against FIFO on simulated workloads: swaps, makespan and waits, side by side.

Run: `python -m bench.simulate [--max-wait 30] [--min-residency 10] [--requests 40]`.

A virtual clock and simulated processes (bench/sim/engine.py) drive the production schedulers;
no process starts and nothing sleeps, so the numbers are deterministic. Every model shares one
exclusive slot (one model loaded at a time), loads in 4 s and serves a request in 1 s ± 20 %.
For each trace the table gives, per scheduler: swaps started, makespan (first arrival to last
answer), and the p50 / p99 / max wait from arrival to grant.

On the closed-loop agents trace the batch scheduler must make at most a fifth of FIFO's swaps,
and no request may wait longer than maxWait + one load time; the exit status is 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys

from bench.sim.run import Summary, simulate
from bench.sim.traces import Trace, bursty_single_model, closed_loop_agents, hot_and_cold, interleaved_burst
from llmswap.config.model import BatchSettings

MAX_SWAP_RATIO = 0.2
HEADER = f"  {'':<6} {'swaps':>6} {'makespan':>10} {'p50':>8} {'p99':>8} {'max':>8} {'errors':>7}   rules"


def traces(requests: int) -> list[Trace]:
    return [
        closed_loop_agents(requests=requests),
        interleaved_burst(),
        bursty_single_model(),
        hot_and_cold(),
    ]


def row(s: Summary) -> str:
    return (f"  {s.scheduler:<6} {s.swaps:>6} {s.makespan:>10.1f} {s.p50:>8.2f} {s.p99:>8.2f} "
            f"{s.max_wait:>8.2f} {s.errors:>7}   {', '.join(f'{k}={v}' for k, v in sorted(s.rules.items()))}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simulate", description=__doc__.splitlines()[0])
    parser.add_argument("--max-wait", type=float, default=BatchSettings.max_wait,
                        help="batch maxWait, seconds")
    parser.add_argument("--min-residency", type=float, default=BatchSettings.min_residency,
                        help="batch minResidency, seconds")
    parser.add_argument("--requests", type=int, default=40, help="requests per agent in the closed loop")
    args = parser.parse_args(argv)
    settings = BatchSettings(max_wait=args.max_wait, min_residency=args.min_residency)

    print(f"batch settings: maxWait {settings.max_wait:g}s, minResidency {settings.min_residency:g}s; "
          "one model loaded at a time")
    ok = True
    for index, trace in enumerate(traces(args.requests)):
        fifo = simulate(trace, "fifo")
        batch = simulate(trace, "batch", batch=settings)
        print(f"\n{trace.name}")
        print(HEADER)
        print(row(fifo))
        print(row(batch))
        if index == 0:
            ratio = batch.swaps / fifo.swaps if fifo.swaps else 0.0
            bound = settings.max_wait + max(m.load for m in trace.models.values())
            ratio_ok = ratio <= MAX_SWAP_RATIO
            wait_ok = batch.max_wait <= bound
            ok = ok and ratio_ok and wait_ok
            print(f"  batch/FIFO swaps: {ratio:.3f} (must be <= {MAX_SWAP_RATIO}: "
                  f"{'ok' if ratio_ok else 'FAILED'}); batch max wait {batch.max_wait:.2f}s "
                  f"(must be <= maxWait + load = {bound:g}s: {'ok' if wait_ok else 'FAILED'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
