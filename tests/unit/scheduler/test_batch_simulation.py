"""bench/simulate.py's traces, small: deterministic swap counts and waits on a virtual clock.

Three agents, each bound to its own model, send a request, wait for the answer, think 50 ms and ask
again. FIFO loads a model for nearly every request; the batch scheduler must make at most a fifth
of FIFO's swaps while no request waits longer than maxWait plus one load time. Nothing here reads a
wall clock: the simulation's clock is virtual and its random service times are seeded.
"""

from __future__ import annotations

import math

import pytest

from bench.sim.run import simulate
from bench.sim.traces import bursty_single_model, closed_loop_agents, interleaved_burst
from llmswap.config.model import BatchSettings


@pytest.mark.parametrize(
    ("max_wait", "min_residency", "load"),
    [(30.0, 10.0, 4.0), (20.0, 5.0, 3.0), (60.0, 10.0, 8.0)],
)
def test_closed_loop_agents_batch_swaps_at_most_a_fifth_of_fifo_within_max_wait(
    max_wait, min_residency, load
):
    trace = closed_loop_agents(requests=20, load=load)
    fifo = simulate(trace, "fifo")
    batch = simulate(trace, "batch", batch=BatchSettings(max_wait=max_wait, min_residency=min_residency))
    assert fifo.requests == batch.requests == 60 and fifo.errors == batch.errors == 0
    assert fifo.swaps >= 55, "FIFO swaps on nearly every request of this trace"
    assert batch.swaps * 5 <= fifo.swaps
    assert batch.max_wait <= max_wait + load
    assert batch.makespan < fifo.makespan


@pytest.mark.parametrize("requests", [30, 90, 180])
def test_open_loop_interleaved_arrivals_load_each_model_once_per_max_wait_window(requests):
    trace = interleaved_burst(requests=requests, interval=1.0, load=4.0)  # a, b, c, a, ... one a second
    batch = simulate(trace, "batch", batch=BatchSettings(max_wait=30.0, min_residency=10.0))
    fifo = simulate(trace, "fifo")
    windows = math.ceil(requests * 1.0 / 30.0)  # arrivals span this many maxWait windows
    assert set(batch.loads) == {"a", "b", "c"}
    assert all(loads <= windows + 1 for loads in batch.loads.values()), batch.loads  # +1: the tail
    assert batch.swaps < fifo.swaps
    assert batch.max_wait <= 30.0 + 4.0


def test_a_single_model_is_loaded_once_by_both():
    trace = bursty_single_model()
    assert simulate(trace, "fifo").swaps == simulate(trace, "batch").swaps == 1
