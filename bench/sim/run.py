"""Running one trace under one scheduler, and the numbers compared side by side.

Every model is in one exclusive group, so one model runs at a time: the machine the issue's
agents fight over (a single GPU). Waits are from arrival to grant, on the virtual clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.sim.engine import Simulation
from bench.sim.traces import Trace
from llmswap.config.model import DEFAULT_GROUP_ID, AdmissionConfig, BatchSettings, GroupConfig
from llmswap.scheduler.batch import BatchScheduler
from llmswap.scheduler.fifo import FifoScheduler
from llmswap.scheduler.settings import QueueSettings
from llmswap.scheduler.swappers.group import GroupSwapper
from llmswap.scheduler.types import Scheduler

SCHEDULERS = ("fifo", "batch")
UNLIMITED = 1_000_000


@dataclass(frozen=True)
class Summary:
    trace: str
    scheduler: str
    requests: int
    errors: int
    swaps: int
    aborts: int
    makespan: float
    p50: float
    p99: float
    max_wait: float
    rules: dict[str, int]  # swaps by SwapPlan.rule
    loads: dict[str, int]  # swaps by target model


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..100); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def simulate(trace: Trace, scheduler: str, *, batch: BatchSettings | None = None,
             admission: AdmissionConfig | None = None, seed: int = 1,
             preempt_below: int | None = None) -> Summary:
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; use one of {', '.join(SCHEDULERS)}")
    group = GroupConfig(DEFAULT_GROUP_ID, swap=True, exclusive=True, members=tuple(trace.models))
    swapper = GroupSwapper({DEFAULT_GROUP_ID: group})

    # Concurrency limits would turn queueing into 429s and hide the scheduling; admission is opt-in.
    limits = dict.fromkeys(trace.models, UNLIMITED)
    settings = QueueSettings(limits=limits, admission=admission, preempt_below=preempt_below)

    def make(sim: Simulation) -> Scheduler:
        if scheduler == "batch":
            return BatchScheduler("sim", swapper, sim, settings=settings, batch=batch or BatchSettings(),
                                  clock=sim.clock)
        return FifoScheduler("sim", swapper, sim, settings=settings, clock=sim.clock)

    sim = Simulation(trace.models, make, seed=seed)
    trace.workload(sim)
    result = sim.run()
    waits = result.waits
    rules: dict[str, int] = {}
    loads: dict[str, int] = {}
    for plan in result.swaps:
        rules[plan.rule] = rules.get(plan.rule, 0) + 1
        loads[plan.model] = loads.get(plan.model, 0) + 1
    return Summary(
        trace=trace.name, scheduler=scheduler, requests=len(result.outcomes), errors=result.errors,
        swaps=len(result.swaps), aborts=result.aborts, makespan=result.end,
        p50=percentile(waits, 50), p99=percentile(waits, 99), max_wait=max(waits, default=0.0), rules=rules,
        loads=loads,
    )
