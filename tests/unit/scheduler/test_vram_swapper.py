"""VramSwapper: the cheapest set of running models whose eviction makes the target fit."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from llmswap.config.model import ModelConfig, VramSettings
from llmswap.machine import DeviceMemory, FootprintBook, GiB, MiB
from llmswap.scheduler.errors import CannotFit
from llmswap.scheduler.swappers.vram import (
    DEFAULT_EVICT_COST,
    MAX_EXACT_CANDIDATES,
    VramSwapper,
    device_budgets,
)

# M and build are shared with test_vram_property.py.


@dataclass(frozen=True)
class M:
    """One model of a table row: sizes in GiB, times in seconds."""

    vram: float | None = None  # declared, GiB
    gpus: tuple[int, ...] | None = None
    persistent: bool = False
    load_time: float | None = None  # measured seconds
    learned: Mapping[int, float] = field(default_factory=dict)  # device -> GiB
    used_at: float | None = None  # last-used clock reading


def build(
    models: Mapping[str, M],
    budgets: Mapping[int, float] | None = None,  # device -> GiB; default one 24 GiB GPU
    *,
    evict_costs: Mapping[str, float] | None = None,
    labels: Mapping[int, str] | None = None,
) -> tuple[VramSwapper, FootprintBook]:
    configs = {
        name: ModelConfig(
            id=name,
            cmd=("serve", name),
            vram=round(m.vram * GiB) if m.vram is not None else None,
            gpus=m.gpus,
            persistent=m.persistent,
        )
        for name, m in models.items()
    }
    budget_bytes = {d: round(b * GiB) for d, b in (budgets or {0: 24}).items()}
    book = FootprintBook(configs, budget_bytes)
    for name, m in models.items():
        if m.learned:
            book.observe(name, {d: round(b * GiB) for d, b in m.learned.items()})
        if m.load_time is not None:
            book.record_load_time(name, m.load_time)
        if m.used_at is not None:
            book.mark_used(name, m.used_at)
    swapper = VramSwapper(book, budget_bytes, configs, evict_costs=evict_costs or {}, device_labels=labels)
    return swapper, book


@dataclass(frozen=True)
class Case:
    models: dict[str, M]
    target: str
    running: tuple[str, ...]
    evict: list[str]
    budgets: dict[int, float] = field(default_factory=lambda: {0: 24})
    evict_costs: dict[str, float] = field(default_factory=dict)


CASES = {
    "fits_without_eviction": Case(
        {"a": M(8, load_time=5), "b": M(8, load_time=5), "t": M(8)}, "t", ("a", "b"), []
    ),
    "fits_exactly_at_the_budget": Case({"a": M(12, load_time=5), "t": M(12)}, "t", ("a",), []),
    "target_already_running_evicts_nothing": Case(
        {"a": M(20, load_time=5), "t": M(20)}, "t", ("a", "t"), []
    ),
    "evicts_the_single_cheapest": Case(
        {"slow": M(10, load_time=30), "quick": M(10, load_time=5), "t": M(10)},
        "t",
        ("slow", "quick"),
        ["quick"],
    ),
    "evicts_two_small_rather_than_one_expensive": Case(
        {"big": M(12, load_time=60), "s1": M(6, load_time=2), "s2": M(6, load_time=3), "t": M(12)},
        "t",
        ("big", "s1", "s2"),
        ["s1", "s2"],
    ),
    "evicts_one_rather_than_two_when_that_is_cheaper": Case(
        {"big": M(12, load_time=4), "s1": M(6, load_time=3), "s2": M(6, load_time=3), "t": M(12)},
        "t",
        ("big", "s1", "s2"),
        ["big"],
    ),
    "evicts_only_what_is_needed": Case(
        {"a": M(8, load_time=1), "b": M(8, load_time=2), "c": M(8, load_time=3), "t": M(16)},
        "t",
        ("a", "b", "c"),
        ["a", "b"],
    ),
    "a_small_model_is_useless_when_alone_it_frees_too_little": Case(
        {"tiny": M(2, load_time=1), "mid": M(14, load_time=9), "t": M(14)}, "t", ("tiny", "mid"), ["mid"]
    ),
    "never_evicts_persistent": Case(
        {"p": M(10, persistent=True, load_time=1), "a": M(10, load_time=50), "t": M(10)},
        "t",
        ("p", "a"),
        ["a"],
    ),
    "evict_costs_override_load_times": Case(
        {"a": M(10, load_time=1), "b": M(10, load_time=5), "t": M(10)},
        "t",
        ("a", "b"),
        ["b"],
        evict_costs={"a": 100},
    ),
    "an_unmeasured_model_costs_the_default": Case(
        {"never_timed": M(10), "b": M(10, load_time=DEFAULT_EVICT_COST + 1), "t": M(10)},
        "t",
        ("never_timed", "b"),
        ["never_timed"],
    ),
    "lru_breaks_a_cost_tie": Case(
        {"recent": M(10, load_time=5, used_at=200), "old": M(10, load_time=5, used_at=100), "t": M(10)},
        "t",
        ("recent", "old"),
        ["old"],
    ),
    "never_used_counts_as_least_recently_used": Case(
        {"used": M(10, load_time=5, used_at=1), "preloaded": M(10, load_time=5), "t": M(10)},
        "t",
        ("used", "preloaded"),
        ["preloaded"],
    ),
    "model_id_breaks_a_full_tie": Case(
        {"b": M(10, load_time=5, used_at=7), "a": M(10, load_time=5, used_at=7), "t": M(10)},
        "t",
        ("b", "a"),
        ["a"],
    ),
    "equal_cost_prefers_evicting_two_older_over_one_newer": Case(
        {
            "new": M(12, load_time=4, used_at=300),
            "old1": M(6, load_time=2, used_at=100),
            "old2": M(6, load_time=2, used_at=110),
            "t": M(12),
        },
        "t",
        ("new", "old1", "old2"),
        ["old1", "old2"],
    ),
    "pinned_models_are_fitted_per_device": Case(
        {"a": M(16, gpus=(0,), load_time=1), "b": M(16, gpus=(1,), load_time=50), "t": M(16, gpus=(1,))},
        "t",
        ("a", "b"),
        ["b"],  # a is cheaper but frees nothing on GPU 1
        budgets={0: 24, 1: 24},
    ),
    "a_model_on_two_devices_frees_half_on_each": Case(
        {"wide": M(32, gpus=(0, 1), load_time=20), "x": M(8, gpus=(0,), load_time=1), "t": M(12, gpus=(0,))},
        "t",
        ("wide", "x"),
        ["wide"],  # x frees 8 of the 12 GiB missing on GPU 0; wide frees 16 there
        budgets={0: 24, 1: 24},
    ),
    "a_target_on_two_devices_needs_room_on_both": Case(
        {"a": M(20, gpus=(0,), load_time=1), "b": M(20, gpus=(1,), load_time=1), "t": M(20, gpus=(0, 1))},
        "t",
        ("a", "b"),
        ["a", "b"],
        budgets={0: 24, 1: 24},
    ),
    "learned_per_device_values_place_the_model": Case(
        {"a": M(16, learned={1: 18}, load_time=1), "b": M(16, gpus=(0,), load_time=9), "t": M(16, gpus=(0,))},
        "t",
        ("a", "b"),
        ["b"],  # a was measured on GPU 1 only, so evicting it frees nothing on GPU 0
        budgets={0: 24, 1: 24},
    ),
    "learned_above_declared_raises_the_footprint": Case(
        {"a": M(8, learned={0: 14}, load_time=5), "t": M(12)}, "t", ("a",), ["a"]
    ),
    "learned_below_declared_does_not_lower_it": Case(
        {"a": M(14, learned={0: 8}, load_time=5), "t": M(12)}, "t", ("a",), ["a"]
    ),
    "an_undeclared_unmeasured_target_runs_alone_beside_persistent": Case(
        {"p": M(4, persistent=True), "a": M(4, load_time=5), "b": M(4, load_time=5), "t": M()},
        "t",
        ("p", "a", "b"),
        ["a", "b"],
    ),
    "a_model_declared_at_zero_takes_no_room": Case(
        {"cpu": M(0, load_time=1), "a": M(12, load_time=9), "t": M(12)}, "t", ("cpu", "a"), []
    ),
    "an_undeclared_unmeasured_running_model_is_evicted_for_anything": Case(
        {"unknown": M(load_time=5), "t": M(1)}, "t", ("unknown",), ["unknown"]
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_vram_evictions(case: Case) -> None:
    swapper, _ = build(case.models, case.budgets, evict_costs=case.evict_costs)
    assert swapper.evictions_for(case.target, list(case.running)) == case.evict


@dataclass(frozen=True)
class Refusal:
    models: dict[str, M]
    target: str
    running: tuple[str, ...]
    message: str
    budgets: dict[int, float] = field(default_factory=lambda: {0: 23.5})


REFUSALS = {
    "too_big_alone": Refusal(
        {"qwen": M(30)},
        "qwen",
        (),
        "model qwen needs 30.0 GiB on GPU 0 but the budget is 23.5 GiB; "
        "lower models.qwen.vram or raise routing.router.settings.budget",
    ),
    "too_big_alone_even_with_nothing_to_evict": Refusal(
        {"a": M(4, load_time=1), "qwen": M(30)}, "qwen", ("a",), "model qwen needs 30.0 GiB on GPU 0"
    ),
    "measured_too_big": Refusal(
        {"qwen": M(20, learned={0: 25})},
        "qwen",
        (),
        "model qwen needs 25.0 GiB on GPU 0 but the budget is 23.5 GiB; it was measured at that size",
    ),
    "cannot_fit_beside_persistent_models": Refusal(
        {"p": M(16, persistent=True), "t": M(10)},
        "t",
        ("p",),
        "model t needs 10.0 GiB on GPU 0 but the budget is 23.5 GiB and the persistent models p (16.0 GiB) "
        "keep 16.0 GiB of it; make one of them non-persistent",
    ),
    "pinned_to_a_missing_device": Refusal(
        {"t": M(4, gpus=(3,))},
        "t",
        (),
        "model t is placed on GPU 3, which was not found (devices found: GPU 0); fix models.t.gpus",
    ),
    "unknown_size_and_persistent_models_hold_everything": Refusal(
        {"p": M(23.5, persistent=True), "t": M()},
        "t",
        ("p",),
        "model t has no declared vram and was never measured, and the persistent models p (23.5 GiB) keep "
        "the whole budget of GPU 0 (23.5 GiB); set models.t.vram",
    ),
    "too_big_on_one_of_its_devices": Refusal(
        {"t": M(40, gpus=(0, 1))},
        "t",
        (),
        "model t needs 20.0 GiB on GPU 1 but the budget is 16.0 GiB",
        budgets={0: 24, 1: 16},
    ),
}


@pytest.mark.parametrize("case", REFUSALS.values(), ids=REFUSALS.keys())
def test_vram_refuses_a_target_that_can_never_fit(case: Refusal) -> None:
    swapper, _ = build(case.models, case.budgets)
    with pytest.raises(CannotFit) as err:
        swapper.evictions_for(case.target, list(case.running))
    assert case.message in err.value.message
    assert err.value.status == 500 and err.value.code == "cannot_fit"


def test_learning_a_bigger_footprint_changes_the_decision(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="llmswap")
    swapper, book = build({"a": M(8, gpus=(0,), load_time=5), "t": M(12, gpus=(0,))})
    assert swapper.evictions_for("t", ["a"]) == []
    book.observe("a", {0: 14 * GiB})
    assert swapper.evictions_for("t", ["a"]) == ["a"]
    warning = "a measured 14.0 GiB, above its declared vram 8.0 GiB"
    assert any(warning in r.getMessage() for r in caplog.records)


def test_plan_reports_needs_costs_and_free_memory() -> None:
    swapper, _ = build(
        {"a": M(10, load_time=7.5), "b": M(6, load_time=30), "t": M(12)},
        evict_costs={},
    )
    plan = swapper.plan("t", ["a", "b"])
    assert plan.need == {0: 12 * GiB}
    assert [(e.model, dict(e.footprint), e.cost) for e in plan.evict] == [("a", {0: 10 * GiB}, 7.5)]
    assert plan.cost == 7.5
    assert plan.free_after == {0: 6 * GiB}  # 24 - 6 (b stays) - 12 (t)
    assert plan.exact


def test_what_sleeping_models_hold_is_room_nobody_else_has_except_the_one_waking() -> None:
    swapper, _ = build({"a": M(10), "b": M(6), "t": M(8), "s": M(12)}, evict_costs={})
    assert swapper.plan("t", ["a", "b"]).evict == ()  # 10 + 6 + 8 = 24: fits
    swapper.asleep = {"s": {0: 2 * GiB}}  # s sleeps, keeping 2 GiB
    plan = swapper.plan("t", ["a", "b"])
    [evicted] = [e.model for e in plan.evict]  # one of them must go now
    kept = {"a": 10, "b": 6}["b" if evicted == "a" else "a"]
    assert plan.free_after == {0: (24 - kept - 2 - 8) * GiB}
    assert swapper.plan("s", ["a"]).evict == ()  # s waking: its own 2 GiB become part of its 12


def test_evictions_are_listed_least_recently_used_first() -> None:
    swapper, _ = build(
        {
            "x": M(8, load_time=1, used_at=50),
            "y": M(8, load_time=1, used_at=10),
            "z": M(8, load_time=1),
            "t": M(24),
        }
    )
    assert swapper.evictions_for("t", ["x", "y", "z"]) == ["z", "y", "x"]


def test_many_candidates_use_the_greedy_fallback_and_still_fit(caplog: pytest.LogCaptureFixture) -> None:
    count = MAX_EXACT_CANDIDATES + 4
    models = {f"m{i:02d}": M(1, load_time=1 + i % 3) for i in range(count)}
    models["t"] = M(5)
    swapper, book = build(models, {0: count})
    running = [m for m in models if m != "t"]
    plan = swapper.plan("t", running)
    assert not plan.exact
    assert len(plan.evict) == 5  # five 1 GiB models make room for 5 GiB
    assert all(book.load_time(e.model) == 1 for e in plan.evict)  # and the cheapest ones at that
    caplog.set_level(logging.INFO, logger="llmswap")
    swapper.on_swap_start("t", running)
    assert "greedy" in caplog.records[-1].getMessage()


def test_greedy_fallback_drops_picks_that_turn_out_unneeded() -> None:
    models = {f"filler{i:02d}": M(1, load_time=2) for i in range(MAX_EXACT_CANDIDATES)}
    models |= {"small": M(2, load_time=0.5), "large": M(10, load_time=3), "t": M(10)}
    # 24 of 24 GiB in use and 10 GiB to free. By cost per byte `small` (0.25 s/GiB) is taken first, then
    # `large` (0.3 s/GiB) for the rest; `large` alone frees enough, so `small` is given back.
    swapper, _ = build(models, {0: 24})
    plan = swapper.plan("t", [m for m in models if m != "t"])
    assert not plan.exact
    assert [e.model for e in plan.evict] == ["large"]
    assert plan.free_after == {0: 0}


def test_evictions_for_never_logs(caplog: pytest.LogCaptureFixture) -> None:
    swapper, _ = build({"a": M(20, load_time=3), "t": M(20), "huge": M(99)})
    caplog.clear()
    caplog.set_level(logging.DEBUG)
    swapper.evictions_for("t", ["a"])
    with pytest.raises(CannotFit):
        swapper.evictions_for("huge", ["a"])
    assert caplog.records == []


def test_on_swap_start_logs_the_decision(caplog: pytest.LogCaptureFixture) -> None:
    swapper, _ = build(
        {"a": M(10, load_time=7.5), "b": M(6, load_time=30), "t": M(12)}, labels={0: "GPU 0"}
    )
    caplog.set_level(logging.INFO, logger="llmswap")
    swapper.on_swap_start("t", ["a", "b"])
    [record] = caplog.records
    assert record.levelno == logging.INFO
    assert record.getMessage() == (
        "vram: loading t (12.0 GiB on GPU 0): evicting a (10.0 GiB on GPU 0, cost 7.5 s), "
        "total cost 7.5 s; free after: 6.0 GiB on GPU 0"
    )


def test_on_swap_start_without_evictions_says_it_fits(caplog: pytest.LogCaptureFixture) -> None:
    swapper, _ = build({"a": M(4, load_time=1), "t": M(512 / 1024)}, labels={0: "host RAM"})
    caplog.set_level(logging.INFO, logger="llmswap")
    swapper.on_swap_start("t", ["a"])
    assert caplog.records[-1].getMessage() == (
        "vram: loading t (512.0 MiB on host RAM) beside what runs; free after: 19.5 GiB on host RAM"
    )


def test_device_budgets_apply_the_budget_per_device_or_subtract_the_reserve() -> None:
    devices = [
        DeviceMemory(0, "A", total=24 * GiB, used=0, free=24 * GiB),
        DeviceMemory(1, "B", total=256 * MiB, used=0, free=256 * MiB),
    ]
    assert device_budgets(VramSettings(), devices) == {0: 24 * GiB - 512 * MiB, 1: 0}
    assert device_budgets(VramSettings(reserve=1 * GiB), devices) == {0: 23 * GiB, 1: 0}
    assert device_budgets(VramSettings(budget=20 * GiB), devices) == {0: 20 * GiB, 1: 20 * GiB}
