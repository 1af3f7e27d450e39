"""GroupSwapper: llama-swap's worked examples G1-G13, then the ones that need the scheduler too."""

from __future__ import annotations

import logging

import pytest

from llmswap.config.matrix_dsl import compile_matrix
from llmswap.config.model import DEFAULT_GROUP_ID, GroupConfig
from llmswap.process.state import ProcessState
from llmswap.scheduler.fifo import FifoScheduler
from llmswap.scheduler.swappers.group import GroupSwapper
from llmswap.scheduler.swappers.matrix import MatrixSwapper
from llmswap.scheduler.types import Swapper
from tests.unit.scheduler.fakes import FakeEffects, ManualClock, RequestFactory

T, F = True, False


def group(gid: str, swap: bool, exclusive: bool, *members: str, persistent: bool = False) -> GroupConfig:
    return GroupConfig(id=gid, swap=swap, exclusive=exclusive, persistent=persistent, members=members)


def groups(*configs: GroupConfig) -> dict[str, GroupConfig]:
    """As the config loader builds them: the implicit default group is always there."""
    out = {g.id: g for g in configs}
    out.setdefault(DEFAULT_GROUP_ID, GroupConfig(DEFAULT_GROUP_ID))
    return out


POSIX = groups(
    group(DEFAULT_GROUP_ID, T, T, "model1", "model3"),
    group("group1", T, F, "model2"),
    group("forever", T, F, "model4", persistent=True),
)

EXAMPLES = [
    ("G1", groups(group("g", T, T, "a", "b")), ["a"], "b", ["a"]),
    ("G2", groups(group("g", F, F, "a", "b")), ["a"], "b", []),
    ("G3", groups(group("g1", T, T, "a"), group("g2", T, T, "b")), ["a"], "b", ["a"]),
    ("G4", groups(group("g1", T, F, "a"), group("g2", T, F, "b")), ["a"], "b", []),
    ("G5", groups(group("g", T, F, "a", "b")), ["a"], "b", ["a"]),
    ("G6", groups(group("persist", T, F, "a", persistent=True), group("other", T, T, "b")), ["a"], "b", []),
    ("G7", groups(group("g1", T, T, "a"), group("g2", T, F, "b")), ["a"], "b", []),
    ("G8", groups(group(DEFAULT_GROUP_ID, T, T, "m1", "m2")), ["m1"], "m2", ["m1"]),
    ("G9", POSIX, ["model1", "model4"], "model2", []),
    ("G10", POSIX, ["model2", "model4"], "model1", ["model2"]),
    ("G11", POSIX, ["model1", "model2", "model4"], "model3", ["model1", "model2"]),
    ("G12", groups(group("g1", T, T, "a"), group("g2", T, F, "b")), ["a", "b"], "a", ["b"]),
    ("G13", groups(group("g", F, T, "a", "b"), group("h", T, T, "c")), ["a", "c"], "b", ["c"]),
]


@pytest.mark.parametrize(
    ("config", "running", "target", "evict"),
    [pytest.param(*example[1:], id=example[0]) for example in EXAMPLES],
)
def test_group_worked_examples(config, running, target, evict):
    assert GroupSwapper(config).evictions_for(target, running) == evict


def test_group_exclusive_unloads_other_groups_but_not_persistent_ones():
    config = groups(
        group("big", T, T, "big"), group("side", F, F, "s1", "s2"), group("keep", T, F, "k", persistent=True)
    )
    assert GroupSwapper(config).evictions_for("big", ["k", "s1", "s2"]) == ["s1", "s2"]


def test_group_persistent_members_still_swap_inside_their_group():
    config = groups(group("keep", T, F, "k1", "k2", persistent=True))
    assert GroupSwapper(config).evictions_for("k2", ["k1"]) == ["k1"]


def test_group_model_in_no_group_behaves_as_the_default_group():
    swapper = GroupSwapper(groups(group("g", T, F, "a")))
    assert swapper.group_of("stray") == DEFAULT_GROUP_ID
    assert swapper.evictions_for("stray", ["a", "other-stray"]) == ["a", "other-stray"]


def test_group_member_of_two_groups_is_refused():
    with pytest.raises(ValueError, match="model member a is used in multiple groups: g1 and g2"):
        GroupSwapper(groups(group("g1", T, T, "a"), group("g2", T, T, "a")))


def test_group_swapper_logs_nothing(caplog):
    swapper = GroupSwapper(groups(group("g", T, T, "a", "b")))
    with caplog.at_level(logging.DEBUG):
        swapper.evictions_for("b", ["a"])
        swapper.on_swap_start("b", ["a"])
    assert caplog.records == []


# ================================================================ examples that need the scheduler


class Router:
    def __init__(self, swapper: Swapper, models: list[str], ready: tuple[str, ...] = ()) -> None:
        self.clock = ManualClock()
        self.effects = FakeEffects(
            {m: ProcessState.READY if m in ready else ProcessState.STOPPED for m in models}
        )
        self.requests = RequestFactory(self.clock)
        self.sched = FifoScheduler("group", swapper, self.effects, clock=self.clock)

    def req(self, model: str):
        r = self.requests.make(model)
        self.sched.on_request(r)
        return r


def test_group_g4_non_exclusive_groups_load_in_parallel():
    router = Router(GroupSwapper(EXAMPLES[3][1]), ["a", "b"])
    router.req("a")
    router.req("b")
    assert [(p.model, p.evict) for p in router.effects.starts] == [("a", ()), ("b", ())]


def test_group_g5_same_group_swap_serialises_and_stops_once():
    router = Router(GroupSwapper(EXAMPLES[4][1]), ["a", "b"])
    ra = router.req("a")
    rb = router.req("b")  # a is loading: b must evict it, so it waits
    assert router.effects.starts_for("b") == 0
    router.effects.complete_swap(router.sched, "a")
    assert router.effects.was_served(ra) and router.effects.starts_for("b") == 0
    router.effects.finish_serving(router.sched, ra)
    assert [(p.model, p.evict) for p in router.effects.starts] == [("a", ()), ("b", ("a",))]
    router.effects.complete_swap(router.sched, "b")
    assert router.effects.was_served(rb)


def test_group_g12_ready_exclusive_member_is_not_fast_pathed():
    router = Router(GroupSwapper(EXAMPLES[11][1]), ["a", "b"], ready=("a", "b"))
    ra = router.req("a")
    assert router.effects.last_start("a").evict == ("b",)
    assert router.effects.is_pending(ra)


def test_matrix_m3_coexisting_set_loads_in_parallel():
    program = compile_matrix({}, [("s_ab", "a & b")], {}, ["a", "b"])
    router = Router(MatrixSwapper(program), ["a", "b"])
    router.req("a")
    router.req("b")
    assert [(p.model, p.evict) for p in router.effects.starts] == [("a", ()), ("b", ())]


def test_matrix_m4_incompatible_model_queues_until_served():
    program = compile_matrix({}, [("s_a", "a"), ("s_b", "b")], {}, ["a", "b"])
    router = Router(MatrixSwapper(program), ["a", "b"])
    ra = router.req("a")
    router.req("b")
    assert router.effects.starts_for("b") == 0
    router.effects.complete_swap(router.sched, "a")
    assert router.effects.starts_for("b") == 0
    router.effects.finish_serving(router.sched, ra)
    assert router.effects.last_start("b").evict == ("a",)


def test_matrix_ready_model_is_always_fast_pathed():
    program = compile_matrix({}, [("s_a", "a"), ("s_b", "b")], {}, ["a", "b"])
    router = Router(MatrixSwapper(program), ["a", "b"], ready=("a", "b"))
    ra = router.req("a")
    assert router.effects.was_served(ra) and router.effects.starts == []
