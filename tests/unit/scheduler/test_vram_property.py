"""VramSwapper against brute force: every answer fits, evicts only what it may, and nothing is cheaper."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from llmswap.machine import FootprintBook
from llmswap.scheduler.errors import CannotFit
from llmswap.scheduler.swappers.vram import DEFAULT_EVICT_COST, VramSwapper
from tests.unit.scheduler.test_vram_swapper import M, build

TARGET = "t"


def gib(low: int, high: int) -> st.SearchStrategy[float]:
    """Whole numbers as floats: sizes in GiB and costs in seconds, so sums compare exactly."""
    return st.integers(low, high).map(float)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict[str, M], dict[int, float], dict[str, float], list[str]]:
    devices = draw(st.integers(1, 2))
    budgets = {d: draw(gib(8, 24)) for d in range(devices)}
    placement = st.none() | st.lists(st.sampled_from(range(devices)), min_size=1, unique=True).map(tuple)
    names = [f"m{i}" for i in range(draw(st.integers(0, 9)))]
    models: dict[str, M] = {}
    for name in [*names, TARGET]:
        learned = draw(st.dictionaries(st.sampled_from(range(devices)), gib(1, 16), max_size=2))
        # The target always has a size; the others may be unknown (sized at the whole budget).
        vram = draw(gib(1, 16) if name == TARGET else st.none() | gib(1, 12))
        models[name] = M(
            vram=vram,
            gpus=draw(placement),
            # A persistent model of unknown size would hold the whole budget and refuse every target.
            persistent=name != TARGET and vram is not None and draw(st.sampled_from([False] * 4 + [True])),
            load_time=draw(st.none() | gib(0, 10)),
            learned=learned,
            used_at=draw(st.none() | gib(0, 3)),  # few values: ties happen
        )
    evict_costs = draw(st.dictionaries(st.sampled_from(names), gib(0, 10), max_size=2)) if names else {}
    # Most models run, so the devices are crowded and there is a choice to make.
    running = [name for name in names if draw(st.integers(0, 4)) > 0]
    return models, budgets, evict_costs, running


def _fits(book: FootprintBook, swapper: VramSwapper, staying: list[str]) -> bool:
    need = book.footprint_of(TARGET).per_device
    return all(
        sum(book.footprint_of(m).per_device.get(d, 0) for m in staying) + b <= swapper.budgets[d]
        for d, b in need.items()
        if b > 0
    )


def _cost(models: dict[str, M], evict_costs: dict[str, float], chosen: tuple[str, ...] | list[str]) -> float:
    total = 0.0
    for m in chosen:
        load_time = models[m].load_time
        total += evict_costs.get(m, load_time if load_time is not None else DEFAULT_EVICT_COST)
    return total


def _lru_rank(book: FootprintBook, running: list[str]) -> dict[str, int]:
    order = sorted(running, key=lambda m: (book.last_used(m) if book.last_used(m) is not None else -1e300, m))
    return {m: i for i, m in enumerate(order)}


# Passing takes seconds; a failure's shrinking can take minutes on a busy machine, and the shrunk
# counterexample is the whole point of the failure.
@pytest.mark.timeout(600)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_vram_choice_fits_is_allowed_and_is_the_cheapest(scenario) -> None:
    models, budgets, evict_costs, running = scenario
    swapper, book = build(models, budgets, evict_costs=evict_costs)
    evictable = [m for m in running if not models[m].persistent]
    valid = [
        subset
        for size in range(len(evictable) + 1)
        for subset in combinations(evictable, size)
        if _fits(book, swapper, [m for m in running if m not in subset])
    ]

    try:
        chosen = swapper.evictions_for(TARGET, running)
    except CannotFit:
        event("refused")
        assert valid == [], "refused although evicting some set would make the target fit"
        return

    # `--hypothesis-show-statistics` shows how often there was a real choice to make.
    event(f"evicts {min(len(chosen), 3)}{'+' if len(chosen) >= 3 else ''}; choice: {len(valid) > 1}")
    assert set(chosen) <= set(evictable), "evicted a model that is not running or is persistent"
    assert len(set(chosen)) == len(chosen)
    assert _fits(book, swapper, [m for m in running if m not in chosen]), "the target does not fit"
    cheapest = min(_cost(models, evict_costs, s) for s in valid)
    assert _cost(models, evict_costs, chosen) == cheapest, "a strictly cheaper valid set exists"

    # Among the cheapest sets the choice is deterministic: the one evicting the least recently used.
    rank = _lru_rank(book, running)
    ties = [s for s in valid if _cost(models, evict_costs, s) == cheapest]
    expected = min(ties, key=lambda s: sorted((rank[m] for m in s), reverse=True))
    assert sorted(chosen) == sorted(expected)


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_vram_running_target_evicts_nothing(scenario) -> None:
    models, budgets, evict_costs, running = scenario
    swapper, _ = build(models, budgets, evict_costs=evict_costs)
    assert swapper.evictions_for(TARGET, [*running, TARGET]) == []
