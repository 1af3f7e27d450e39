"""`Books.decide` as the one decision, with the policy's rule for a swap's victims in it, and `Books.apply`
carrying out every place, a swap's start included: loop-free, against FakeEffects."""

from __future__ import annotations

from llmswap.process.state import ProcessState
from llmswap.scheduler.decision import Place
from llmswap.scheduler.fifo import RULE_REQUEST, FifoScheduler
from llmswap.scheduler.types import Unload
from tests.unit.scheduler.fakes import FakeEffects, ManualClock, RequestFactory, ScriptedSwapper

READY, STOPPED = ProcessState.READY, ProcessState.STOPPED


def world(states: dict[str, ProcessState], evict: dict[str, list[str]]):
    clock = ManualClock()
    effects = FakeEffects(states)
    sched = FifoScheduler("test", ScriptedSwapper(evict), effects, clock=clock)
    return sched, effects, RequestFactory(clock)


def test_without_a_rule_a_swap_is_only_needed_and_with_one_it_waits_for_the_rules_reason() -> None:
    sched, _, _ = world({"a": READY, "b": STOPPED}, {"b": ["a"]})
    books = sched.books
    assert books.decide("b").place is Place.SWAP  # what admission and the drain's bookkeeping read
    kept = books.decide("b", None, lambda victim: f"{victim} is busy")
    assert (kept.place, kept.evict, kept.why) == (Place.WAIT, ("a",), "a is busy")
    free = books.decide("b", None, lambda victim: None)
    assert (free.place, free.evict, free.running) == (Place.SWAP, ("a",), ("a",))


def test_a_victim_being_unloaded_holds_the_swap_whatever_the_policys_rule() -> None:
    sched, effects, _ = world({"a": READY, "b": STOPPED}, {"b": ["a"]})
    sched.on_unload(Unload(("a",), None))
    assert effects.stops  # the unload is under way: a stops
    decision = sched.books.decide("b", None, lambda victim: None)
    assert (decision.place, decision.why) == (Place.WAIT, "it would evict a model being unloaded")


def test_apply_starts_a_swap_decided_under_the_rule_with_the_rule_and_detail_it_is_given() -> None:
    sched, effects, requests = world({"a": READY, "b": STOPPED}, {"b": ["a"]})
    req = requests.make("b")
    decision = sched.books.decide("b", req, lambda victim: None)
    assert sched.books.apply(req, decision, RULE_REQUEST, lambda: "detail") is True
    plan = effects.last_start("b")
    assert plan is not None and (plan.evict, plan.rule, plan.detail) == (("a",), RULE_REQUEST, "detail")
    assert sched.books.loading("b")  # on the books: the next request for b joins it
    assert sched.books.decide("b").place is Place.JOIN


def test_fifo_swaps_only_once_its_victim_stopped_serving() -> None:
    sched, effects, requests = world({"a": STOPPED, "b": STOPPED}, {"b": ["a"]})
    ra = requests.make("a")
    sched.on_request(ra)
    effects.complete_swap(sched, "a")
    rb = requests.make("b")
    sched.on_request(rb)
    why = sched.books.decide("b", rb, sched._stops).why  # the same rule its placement uses
    assert why == "it would evict a, still serving" and effects.starts_for("b") == 0
    effects.finish_serving(sched, ra)
    assert effects.last_start("b") is not None and effects.last_start("b").evict == ("a",)
