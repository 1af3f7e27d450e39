"""Swap-aware batching against FIFO on simulated workloads: swaps, makespan and waits, side by side.

Run: `python -m bench.simulate [--max-wait 30] [--min-residency 10] [--requests 40]`.

A virtual clock and simulated processes (bench/sim/engine.py) drive the production schedulers;
no process starts and nothing sleeps, so the numbers are deterministic. Every model shares one
exclusive slot (one model loaded at a time), loads in 4 s and serves a request in 1 s ± 20 %.
For each trace the table gives, per scheduler: swaps started, makespan (first arrival to last
answer), and the p50 / p99 / max wait from arrival to grant.

On every trace the batch scheduler must finish no later than FIFO (makespan), start no more swaps,
and keep every wait within maxWait + one load time; on the closed-loop agents trace it must also
make at most a fifth of FIFO's swaps. The exit status is 1 when any bound is broken (`check`).
"""

from __future__ import annotations

import argparse
import sys

from bench.sim.run import Summary, simulate
from bench.sim.traces import (
    Trace,
    background_tasks,
    bursty_multi_model,
    bursty_single_model,
    closed_loop_agents,
    heavy_tailed,
    hot_and_cold,
    interleaved_burst,
    zipf_models,
)
from llmswap.config.model import BatchSettings

MAX_SWAP_RATIO = 0.2
EPSILON = 1e-6  # seconds: float noise, not a margin
HEADER = f"  {'':<6} {'swaps':>6} {'makespan':>10} {'p50':>8} {'p99':>8} {'max':>8} {'errors':>7}   rules"


def traces(requests: int) -> list[Trace]:
    return [
        closed_loop_agents(requests=requests),
        closed_loop_agents(requests=6, load=1.0, service=0.05),  # the acceptance agents: 6 each, 1 s starts
        interleaved_burst(),
        bursty_single_model(),
        hot_and_cold(),
        bursty_multi_model(),
        heavy_tailed(),
        zipf_models(),
        background_tasks(),
    ]


def check(trace: Trace, fifo: Summary, batch: Summary, settings: BatchSettings, *,
          closed_loop: bool) -> list[str]:
    """The bounds batch must keep against FIFO on `trace`: one line per bound, 'ok' or 'FAILED'."""
    bound = settings.max_wait + max(m.load for m in trace.models.values())
    lines = [
        _verdict(f"makespan {batch.makespan:.1f}s <= FIFO's {fifo.makespan:.1f}s",
                 batch.makespan <= fifo.makespan + EPSILON),
        _verdict(f"swaps {batch.swaps} <= FIFO's {fifo.swaps}", batch.swaps <= fifo.swaps),
        _verdict(f"max wait {batch.max_wait:.2f}s <= maxWait + load = {bound:g}s", batch.max_wait <= bound),
        _verdict(f"errors {batch.errors} == FIFO's {fifo.errors}", batch.errors == fifo.errors),
    ]
    if closed_loop:
        ratio = batch.swaps / fifo.swaps if fifo.swaps else 0.0
        lines.append(_verdict(f"batch/FIFO swaps {ratio:.3f} <= {MAX_SWAP_RATIO}", ratio <= MAX_SWAP_RATIO))
    return lines


def _verdict(text: str, ok: bool) -> str:
    return f"{text}: {'ok' if ok else 'FAILED'}"


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
        lines = check(trace, fifo, batch, settings, closed_loop=index == 0)
        ok = ok and not any(line.endswith("FAILED") for line in lines)
        print("  " + "; ".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
