"""The selector choice as a pure function of target views and counts (llama-swap's cases, then llmswap's
queue-aware ones), and the scheduler's `accepts` query it reads under the batch scheduler."""

from __future__ import annotations

import pytest

from llmswap.config.model import DEFAULT_GROUP_ID, AdmissionConfig, GroupConfig, SelectorConfig
from llmswap.process.state import ProcessState
from llmswap.scheduler.batch import BatchScheduler
from llmswap.scheduler.settings import QueueSettings
from llmswap.scheduler.swappers.group import GroupSwapper
from llmswap.scheduler.types import ModelLoad
from llmswap.server.inference.selectors import Choice, NoTarget, TargetView, choose
from tests.unit.scheduler.fakes import FakeEffects, ManualClock, RequestFactory

READY, STARTING = ProcessState.READY, ProcessState.STARTING
STOPPED, STOPPING = ProcessState.STOPPED, ProcessState.STOPPING


def sel(strategy: str, *targets: str, spillover: int = 1) -> SelectorConfig:
    return SelectorConfig("s", strategy, targets, spillover=spillover)


def local(name: str, state: ProcessState = STOPPED, **load: object) -> TargetView:
    return TargetView(name, name, ModelLoad(state, **load))  # type: ignore[arg-type]


def peer(name: str) -> TargetView:
    return TargetView(name, name, None)


def test_pin_always_takes_the_first_target() -> None:
    assert choose(sel("pin", "a", "b"), [local("a"), local("b", READY)], {}) == Choice(0)


@pytest.mark.parametrize(("states", "expected"), [
    ((STARTING, STOPPED, READY), 2),  # a ready target first
    ((STARTING, STARTING, STOPPED), 0),  # else the first starting
    ((STOPPED, STOPPED, STOPPED), 0),  # else a cold start of the first
    ((STOPPING, READY, STOPPED), 1),  # stopping is neither warm nor ready
])
def test_warm_prefers_ready_then_starting_then_the_first(states: tuple[ProcessState, ...],
                                                          expected: int) -> None:
    views = [local(name, state) for name, state in zip("abc", states, strict=True)]
    assert choose(sel("warm", "a", "b", "c"), views, {}).index == expected


def test_warm_counts_queued_requests_as_warming() -> None:
    # b has requests queued (the batch scheduler will load it on its turn): joining them starts nothing new.
    views = [local("a"), local("b", waiting=2)]
    assert choose(sel("warm", "a", "b"), views, {}).index == 1


def test_warm_does_not_cold_start_while_a_warm_target_can_take_the_request() -> None:
    views = [local("a"), local("b", READY, in_flight=3, waiting=4, accepts=True)]
    assert choose(sel("warm", "a", "b"), views, {}).index == 1


def test_warm_skips_a_warm_target_at_its_bound_for_the_first_that_would_take_it() -> None:
    views = [local("a", READY, in_flight=2, accepts=False), local("b"), local("c")]
    assert choose(sel("warm", "a", "b", "c"), views, {}).index == 1


def test_warm_with_nothing_that_would_take_it_answers_with_the_first_target() -> None:
    views = [local("a", READY, accepts=False), local("b", accepts=False)]
    assert choose(sel("warm", "a", "b"), views, {}).index == 0


def test_spillover_fills_the_first_then_starts_the_next() -> None:
    selector = sel("spillover", "a", "b", "c", spillover=2)
    views = [local("a"), local("b"), local("c")]
    assert choose(selector, views, {}).index == 0  # nothing active: the first cold
    views[0] = local("a", STARTING)
    assert choose(selector, views, {"a": 1}).index == 0  # below the spillover setting
    assert choose(selector, views, {"a": 2}).index == 1  # full: the first cold one


def test_spillover_takes_the_least_busy_active_below_the_setting() -> None:
    selector = sel("spillover", "a", "b", "c", spillover=2)
    views = [local("a", READY), local("b", READY), local("c", READY)]
    assert choose(selector, views, {"a": 1, "b": 2, "c": 0}).index == 2


def test_spillover_ties_go_round_robin() -> None:
    selector = sel("spillover", "a", "b", "c")
    views = [local("a", READY), local("b", READY), local("c", READY)]
    picks = [choose(selector, views, {}, turn) for turn in range(4)]
    assert [pick.index for pick in picks] == [0, 1, 2, 0]
    assert all(pick.round_robin for pick in picks)


def test_spillover_oversubscribes_the_least_busy_when_nothing_is_cold() -> None:
    selector = sel("spillover", "a", "b")
    views = [local("a", READY), local("b", READY)]
    assert choose(selector, views, {"a": 3, "b": 2}).index == 1


def test_spillover_peer_targets_are_active_only_while_they_hold_requests() -> None:
    selector = sel("spillover", "a", "lan/m")
    views = [local("a", READY), peer("lan/m")]
    assert choose(selector, views, {"a": 1}).index == 1  # a is full, the peer is the next (cold) one
    assert choose(selector, views, {"a": 1, "lan/m": 1}).index == 0  # tie on least busy: round robin
    assert choose(selector, views, {"a": 2, "lan/m": 1}).index == 1


def test_spillover_skips_a_target_that_would_refuse_while_another_has_room() -> None:
    selector = sel("spillover", "a", "b", spillover=4)
    views = [local("a", READY, accepts=False), local("b")]
    assert choose(selector, views, {"a": 1}).index == 1


def test_spillover_with_every_target_stopping_has_no_target() -> None:
    with pytest.raises(NoTarget, match='selector "s" has no available spillover targets'):
        choose(sel("spillover", "a", "b"), [local("a", STOPPING), local("b", STOPPING)], {})


# ------------------------------------------------------------------------------ the scheduler's query


def batch_world(admission: AdmissionConfig, limits: dict[str, int] | None = None) -> tuple[
        BatchScheduler, FakeEffects, RequestFactory]:
    clock = ManualClock()
    effects = FakeEffects({"a": STOPPED, "b": STOPPED})
    swapper = GroupSwapper({DEFAULT_GROUP_ID: GroupConfig(DEFAULT_GROUP_ID, members=("a", "b"))})
    settings = QueueSettings(limits=limits or {}, admission=admission)
    sched = BatchScheduler("t", swapper, effects, settings=settings, clock=clock)
    return sched, effects, RequestFactory(clock)


def test_accepts_counts_queued_requests_against_the_queue_bound() -> None:
    sched, _, requests = batch_world(AdmissionConfig(max_queue_per_model=2))
    assert sched.accepts("a")
    sched.on_request(requests.make("a"))
    assert sched.accepts("a")
    sched.on_request(requests.make("a"))
    assert not sched.accepts("a")  # two wait already: a third would be refused
    assert sched.accepts("b")
    assert not sched.accepts("nope")


def test_accepts_counts_queued_and_running_against_the_concurrency_limit() -> None:
    sched, effects, requests = batch_world(AdmissionConfig(), limits={"a": 2})
    first = requests.make("a")
    sched.on_request(first)
    effects.complete_swap(sched, "a", None, 1.0)
    assert effects.was_served(first)
    assert sched.accepts("a")
    sched.on_request(requests.make("a"))
    assert not sched.accepts("a")  # one running + one more = its concurrencyLimit
