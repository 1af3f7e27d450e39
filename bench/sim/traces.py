"""The workloads the simulator replays, each a function that schedules clients on a `Simulation`.

- closed-loop agents: each agent is bound to its own model, sends a request, waits for the answer,
  thinks, sends the next. FIFO swaps on nearly every request here: each new request arrives while
  another model is serving.
- interleaved burst: open loop, requests for the models in turn at a fixed interval.
- bursty single model: bursts of requests for one model, quiet in between.
- one hot + many cold: a steady stream for one model, a few scattered requests for each of the others.
  Its default keeps the swap work within what one slot can do: with more cold requests (say 3 per
  cold model in 120 s) every cold request costs a load and the hot model's reload, the machine is
  over capacity, and no scheduler can bound waits (batch then degrades to earliest deadline first).
- bursty multi-model: bursts for one model at a time, the model changing from burst to burst.
- heavy-tailed: open-loop arrivals over models whose service times differ tenfold, each ±90 %.
- Zipf: many models, popularity falling with rank (a few hot, a long tail of cold ones).
- background tasks: three task workers (priority -1) drain a batch on one model while sparse
  interactive requests for another model arrive.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from bench.sim.engine import ModelTimes, Outcome, Simulation

Workload = Callable[[Simulation], None]


@dataclass(frozen=True)
class Trace:
    name: str
    models: Mapping[str, ModelTimes]
    workload: Workload


def closed_loop_agents(
    agents: int = 3, requests: int = 40, *, think: float = 0.05, load: float = 4.0, service: float = 1.0
) -> Trace:
    models = {f"agent{i}-model": ModelTimes(load=load, service=service) for i in range(agents)}

    def agent(sim: Simulation, model: str) -> Callable[[], None]:
        left = requests

        def send() -> None:
            nonlocal left
            left -= 1
            sim.submit(model, on_done=answered)

        def answered(_: Outcome) -> None:
            if left > 0:
                sim.after(think, send)

        return send

    def workload(sim: Simulation) -> None:
        for i, model in enumerate(models):
            sim.at(i * 0.01, agent(sim, model))

    return Trace(f"closed-loop agents ({agents} x {requests}, think {think * 1000:.0f} ms)", models, workload)


def interleaved_burst(models_count: int = 3, requests: int = 90, *, interval: float = 1.0,
                      load: float = 4.0, service: float = 1.0) -> Trace:
    models = {chr(ord("a") + i): ModelTimes(load=load, service=service) for i in range(models_count)}
    names = list(models)

    def workload(sim: Simulation) -> None:
        for n in range(requests):
            model = names[n % len(names)]
            sim.at(n * interval, lambda model=model: sim.submit(model))

    return Trace(f"open-loop interleaved ({requests} requests over {models_count} models, one per "
                 f"{interval:g} s)", models, workload)


def bursty_single_model(bursts: int = 3, size: int = 20, *, gap: float = 30.0, load: float = 4.0,
                        service: float = 1.0) -> Trace:
    models = {"solo": ModelTimes(load=load, service=service)}

    def workload(sim: Simulation) -> None:
        for b in range(bursts):
            for n in range(size):
                sim.at(b * gap + n * 0.02, lambda: sim.submit("solo"))

    return Trace(f"bursty single model ({bursts} bursts of {size})", models, workload)


def hot_and_cold(cold: int = 6, *, duration: float = 180.0, hot_rate: float = 2.0, cold_requests: int = 2,
                 load: float = 4.0, service: float = 1.0, seed: int = 7) -> Trace:
    models = {"hot": ModelTimes(load=load, service=service)}
    models.update({f"cold{i}": ModelTimes(load=load, service=service) for i in range(cold)})

    def workload(sim: Simulation) -> None:
        rng = random.Random(seed)
        t = 0.0
        while True:
            t += rng.expovariate(hot_rate)
            if t >= duration:
                break
            sim.at(t, lambda: sim.submit("hot"))
        for i in range(cold):
            for _ in range(cold_requests):
                sim.at(rng.uniform(0, duration), lambda i=i: sim.submit(f"cold{i}"))

    return Trace(f"one hot + {cold} cold ({duration:.0f} s)", models, workload)


def bursty_multi_model(models_count: int = 4, bursts: int = 6, size: int = 8, *, gap: float = 20.0,
                       load: float = 4.0, service: float = 1.0, seed: int = 11) -> Trace:
    """Bursts of requests, each burst for one model picked at random, a quiet gap between bursts."""
    models = {f"m{i}": ModelTimes(load=load, service=service) for i in range(models_count)}
    names = list(models)

    def workload(sim: Simulation) -> None:
        rng = random.Random(seed)
        for b in range(bursts):
            model = rng.choice(names)
            start = b * gap + rng.uniform(0, gap / 4)
            for n in range(size):
                sim.at(start + n * 0.1, lambda model=model: sim.submit(model))

    return Trace(f"bursty multi-model ({bursts} bursts of {size} over {models_count} models)", models,
                 workload)


def heavy_tailed(models_count: int = 3, requests: int = 90, *, rate: float = 1.0, load: float = 4.0,
                 seed: int = 5) -> Trace:
    """Open-loop Poisson arrivals over models whose service times differ tenfold and spread widely."""
    services = [0.3, 1.0, 3.0]
    models = {f"s{i}": ModelTimes(load=load, service=services[i % len(services)], spread=0.9)
              for i in range(models_count)}
    names = list(models)

    def workload(sim: Simulation) -> None:
        rng = random.Random(seed)
        t = 0.0
        for _ in range(requests):
            t += rng.expovariate(rate)
            model = rng.choice(names)
            sim.at(t, lambda model=model: sim.submit(model))

    return Trace(f"heavy-tailed service times ({requests} requests, 0.3-3 s x ±90 %)", models, workload)


def zipf_models(models_count: int = 10, requests: int = 120, *, rate: float = 0.4, exponent: float = 1.2,
                load: float = 4.0, service: float = 1.0, seed: int = 3) -> Trace:
    """Many models, each request's model drawn with Zipf popularity (rank k with weight 1/k^s)."""
    models = {f"z{i}": ModelTimes(load=load, service=service) for i in range(models_count)}
    names = list(models)
    weights = [1 / (k + 1) ** exponent for k in range(models_count)]

    def workload(sim: Simulation) -> None:
        rng = random.Random(seed)
        t = 0.0
        for _ in range(requests):
            t += rng.expovariate(rate)
            model = rng.choices(names, weights)[0]
            sim.at(t, lambda model=model: sim.submit(model))

    return Trace(f"{models_count} models, Zipf popularity (s={exponent:g}, {requests} requests)", models,
                 workload)


def background_tasks(tasks: int = 30, *, interactive_rate: float = 0.2, duration: float = 150.0,
                     load: float = 4.0, seed: int = 9) -> Trace:
    """A task batch (low priority, one model, three at a time) behind sparse interactive chat traffic."""
    models = {"chat": ModelTimes(load=load, service=1.0), "batch-model": ModelTimes(load=load, service=2.0)}

    def workload(sim: Simulation) -> None:
        rng = random.Random(seed)
        left = tasks

        def task_worker() -> None:
            nonlocal left
            if left <= 0:
                return
            left -= 1
            sim.submit("batch-model", priority=-1, on_done=lambda _: sim.after(0.01, task_worker))

        for w in range(3):
            sim.at(w * 0.01, task_worker)
        t = 0.0
        while True:
            t += rng.expovariate(interactive_rate)
            if t >= duration:
                break
            sim.at(t, lambda: sim.submit("chat"))

    return Trace(f"{tasks} background tasks under interactive chat ({duration:.0f} s)", models, workload)
