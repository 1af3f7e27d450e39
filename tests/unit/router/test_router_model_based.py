"""A randomized model-based test of Router + FIFO + swappers over fake processes.

Random arrivals, client cancellations, admin unloads and failing starts. Checked: every start happens
with a running set the swapper accepts (no rule violated at any instant), every request ends exactly
once (served, errored or cancelled), the bookkeeping returns to zero, and nothing deadlocks.

Each scenario runs on a virtual clock (`tests/helpers/virtual_time.py`): its sleeps cost nothing, and the
interleaving is the seed's alone, the same on every machine (a test below plays one seed twice).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from llmswap.config.matrix_dsl import compile_matrix
from llmswap.config.model import (
    Config,
    GroupConfig,
    MatrixConfig,
    ModelConfig,
    RouterConfig,
    RoutingConfig,
)
from llmswap.process.state import ProcessState
from llmswap.router import build_router
from llmswap.scheduler.errors import SchedulerError
from tests.helpers.fake_process import FakeScript, fake_factory
from tests.helpers.virtual_time import run_virtual

MODELS = ("a", "b", "c", "d", "e")


def group_routing() -> RouterConfig:
    groups = {
        "(default)": GroupConfig("(default)"),
        "solo": GroupConfig("solo", swap=True, exclusive=True, members=("a", "b")),
        "pair": GroupConfig("pair", swap=False, exclusive=False, members=("c", "d")),
        "pinned": GroupConfig("pinned", swap=True, exclusive=False, persistent=True, members=("e",)),
    }
    return RouterConfig(use="group", groups=groups)


def matrix_routing() -> RouterConfig:
    sets = (("ac", "a & c"), ("bcd", "b & (c | d)"), ("de", "d & e"))
    program = compile_matrix({}, sets, {"c": 3}, MODELS)
    return RouterConfig(use="matrix", matrix=MatrixConfig(sets=program.sets, program=program))


class Scenario:
    def __init__(self, seed: int, routing: RouterConfig) -> None:
        self.rng = random.Random(seed)
        self.violations: list[str] = []
        self.failing = True
        models = {m: ModelConfig(id=m, cmd=("true",), concurrency_limit=4) for m in MODELS}
        self.config = Config(models=models, routing=RoutingConfig(router=routing))
        self.script = FakeScript(
            start_delay=lambda m: self.rng.uniform(0, 0.01),
            fails=lambda m: self.failing and self.rng.random() < 0.1,
            stop_delay=0.001,
            on_state=self.check_start,
        )
        self.loop = asyncio.get_running_loop()
        self.router = build_router(self.config, process_factory=fake_factory(self.script),
                                   clock=self.loop.time)
        self.outcomes: Counter[str] = Counter()
        self.ended: Counter[int] = Counter()
        self.trace: list[tuple[float, str, str]] = []  # (virtual time, model, state) of every change

    def check_start(self, model: str, state: ProcessState) -> None:
        self.trace.append((self.loop.time(), model, state.name))
        if state is not ProcessState.STARTING:
            return
        running = sorted(
            m for m, p in self.router.processes.items() if m != model and p.state.is_running
        )
        swapper = self.router.policy.swapper
        if self.config.routing.router.use == "matrix":
            # Sets are not pairwise: the whole running set plus the newcomer must fit one combination.
            evict = swapper.evictions_for(model, running)
            if evict:
                self.violations.append(f"{model} started beside {running}, which must evict {evict}")
            return
        # Group rules are asymmetric on purpose (llama-swap's gotcha G7: a non-exclusive group never
        # unloads an exclusive one), so a newcomer may legally start beside a model it would evict if
        # that model arrived while the newcomer's swap was in progress. What must never happen is two
        # models running together that would each evict the other.
        for other in running:
            mutual = other in swapper.evictions_for(model, [other]) and model in swapper.evictions_for(
                other, [model]
            )
            if mutual:
                self.violations.append(f"{model} started beside {other}: each must evict the other")

    async def client(self, i: int) -> None:
        await asyncio.sleep(self.rng.uniform(0, 0.03))
        model = self.rng.choice(MODELS)
        hold = self.rng.uniform(0, 0.004)

        async def request() -> None:
            async with self.router.acquire(model) as process:
                assert process.id == model
                assert process.state is ProcessState.READY or process.state is ProcessState.STOPPING
                await asyncio.sleep(hold)

        task = asyncio.create_task(request())
        if self.rng.random() < 0.15:
            await asyncio.sleep(self.rng.uniform(0, 0.01))
            task.cancel()
        try:
            await task
            outcome = "served"
        except asyncio.CancelledError:
            outcome = "cancelled"
        except SchedulerError as err:
            outcome = type(err).__name__
        self.outcomes[outcome] += 1
        self.ended[i] += 1

    async def admin(self) -> None:
        for _ in range(3):
            await asyncio.sleep(self.rng.uniform(0.005, 0.03))
            targets = self.rng.sample(MODELS, self.rng.randint(1, 2))
            await self.router.unload(targets)

    async def run(self, clients: int) -> None:
        self.router.start()
        work = [self.client(i) for i in range(clients)] + [self.admin()]
        await asyncio.wait_for(asyncio.gather(*work), timeout=30)  # a deadlock fails here
        await self.router.wait_idle()


async def played(seed: int, routing: RouterConfig, clients: int = 60) -> Scenario:
    """One scenario, checked inside its loop; the scenario returned (its outcomes and trace)."""
    scenario = Scenario(seed, routing)
    await scenario.run(clients)
    router = scenario.router

    assert scenario.violations == []
    assert sorted(scenario.ended) == list(range(clients))
    assert set(scenario.ended.values()) == {1}  # every request ended exactly once
    assert sum(scenario.outcomes.values()) == clients
    expected = {"served", "cancelled", "SwapFailed", "ModelUnloaded", "ConcurrencyLimit"}
    assert set(scenario.outcomes) <= expected
    assert scenario.outcomes["served"] > 0

    snapshot = router.snapshot()
    assert snapshot.in_flight == {}
    assert snapshot.waiting == {}
    assert snapshot.loading == ()
    assert all(p.in_flight == 0 for p in router.processes.values())  # type: ignore[attr-defined]
    assert router.scheduler.books.reserved == {}  # type: ignore[attr-defined]

    # Still serving afterwards: the bookkeeping did not strand any model.
    scenario.failing = False
    for model in MODELS:
        async with router.acquire(model) as process:
            assert process.state is ProcessState.READY
    await router.shutdown()
    return scenario


@pytest.mark.parametrize("routing", [group_routing, matrix_routing], ids=["group", "matrix"])
@pytest.mark.parametrize("seed", range(8))
def test_random_traffic_keeps_router_consistent(seed: int, routing) -> None:  # type: ignore[no-untyped-def]
    run_virtual(played(seed, routing()))


@pytest.mark.parametrize("routing", [group_routing, matrix_routing], ids=["group", "matrix"])
def test_the_same_seed_plays_the_same_traffic_to_the_same_end(routing) -> None:  # type: ignore[no-untyped-def]
    first, second = run_virtual(played(3, routing())), run_virtual(played(3, routing()))
    assert first.outcomes == second.outcomes
    assert len(first.trace) > 20 and first.trace == second.trace
