"""bench/simulate.py's traces on a virtual clock: the batch scheduler never loses to FIFO.

Every trace the simulator prints is run here under both schedulers and held to the simulator's own
bounds (`bench.simulate.check`): batch finishes no later than FIFO, starts no more swaps, keeps every
wait within maxWait plus one load time, and on the closed-loop agents trace makes at most a fifth of
FIFO's swaps. Nothing here reads a wall clock: the simulation's clock is virtual and its random
service times are seeded and drawn per request, so both schedulers serve the same requests.
"""

from __future__ import annotations

import pytest

from bench.sim.run import simulate
from bench.sim.traces import background_tasks, bursty_single_model, closed_loop_agents, interleaved_burst
from bench.simulate import check, main, traces
from llmswap.config.model import BatchSettings

SETTINGS = BatchSettings()


@pytest.mark.parametrize("index", range(len(traces(40))), ids=[t.name.split(" (")[0] for t in traces(40)])
def test_batch_keeps_every_simulator_bound_against_fifo(index):
    trace = traces(40)[index]
    fifo = simulate(trace, "fifo")
    batch = simulate(trace, "batch", batch=SETTINGS)
    lines = check(trace, fifo, batch, SETTINGS, closed_loop=index == 0)
    assert not [line for line in lines if line.endswith("FAILED")], lines


def test_simulator_exits_zero_when_every_bound_holds(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out and "Zipf" in out and "background tasks" in out


@pytest.mark.parametrize(
    ("max_wait", "min_residency", "load"),
    [(30.0, 10.0, 4.0), (20.0, 5.0, 3.0), (60.0, 10.0, 8.0)],
)
def test_closed_loop_agents_batch_swaps_at_most_a_fifth_of_fifo_within_max_wait(
    max_wait, min_residency, load
):
    trace = closed_loop_agents(requests=40, load=load)
    fifo = simulate(trace, "fifo")
    batch = simulate(trace, "batch", batch=BatchSettings(max_wait=max_wait, min_residency=min_residency))
    assert fifo.requests == batch.requests == 120 and fifo.errors == batch.errors == 0
    assert fifo.swaps >= 110, "FIFO swaps on nearly every request of this trace"
    assert batch.swaps * 5 <= fifo.swaps
    assert batch.max_wait <= max_wait + load
    assert batch.makespan < fifo.makespan


@pytest.mark.parametrize("service", [0.05, 0.2, 1.0])
def test_acceptance_agents_load_each_model_once_after_the_first_exchange(service):
    # Three agents, three models, one loaded at a time, six requests each, 50 ms think, 1 s starts.
    trace = closed_loop_agents(3, 6, think=0.05, load=1.0, service=service)
    batch = simulate(trace, "batch")
    assert batch.requests == 18 and batch.errors == 0
    assert batch.swaps <= 4, batch.loads  # the first model twice (its first exchange teaches), then once each
    assert batch.makespan < simulate(trace, "fifo").makespan


@pytest.mark.parametrize("requests", [30, 90, 180])
def test_open_loop_interleaved_arrivals_batch_neither_swaps_more_nor_finishes_later(requests):
    trace = interleaved_burst(requests=requests, interval=1.0, load=4.0)  # a, b, c, a, ... one a second
    batch = simulate(trace, "batch", batch=BatchSettings(max_wait=30.0, min_residency=10.0))
    fifo = simulate(trace, "fifo")
    assert set(batch.loads) == {"a", "b", "c"}
    assert batch.swaps <= fifo.swaps
    assert batch.makespan <= fifo.makespan
    assert batch.max_wait <= 30.0 + 4.0
    assert batch.rules.get("batch.no_gain", 0) > 0, "open-loop: holding the loaded model saves nothing"


def test_a_single_model_is_loaded_once_by_both():
    trace = bursty_single_model()
    assert simulate(trace, "fifo").swaps == simulate(trace, "batch").swaps == 1


@pytest.mark.parametrize("scheduler", ["fifo", "batch"])
def test_preempting_background_tasks_bounds_the_interactive_wait_to_about_one_load(scheduler):
    trace = background_tasks()  # three task workers (priority -1) keep their model busy; chat arrives
    waited = simulate(trace, scheduler)
    preempted = simulate(trace, scheduler, preempt_below=0)
    load = max(m.load for m in trace.models.values())
    service = max(m.service * (1 + m.spread) for m in trace.models.values())
    assert waited.max_wait > 2 * load, "without preemption chat waits for the task batch"
    assert preempted.max_wait <= load + service
    assert preempted.errors > 0 and waited.errors == 0, "the preempted task requests were answered Preempted"
