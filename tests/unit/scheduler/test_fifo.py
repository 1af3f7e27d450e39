"""FifoScheduler driven event by event against FakeEffects: synchronous, no loop, no processes.

The first block mirrors llama-swap's `fifo_test.go` one test per pinned behaviour (reference 3.6);
the rest covers what our asyncio contracts add (asynchronous stops, aborts, positions, priorities).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import pytest

from llmswap.config.model import DEFAULT_GROUP_ID, GroupConfig
from llmswap.process.state import ProcessState
from llmswap.scheduler.errors import (
    CannotFit,
    ConcurrencyLimit,
    ModelNotFound,
    ModelUnloaded,
    ShuttingDown,
    SwapFailed,
)
from llmswap.scheduler.fifo import RULE_DRAIN, RULE_REQUEST, FifoScheduler
from llmswap.scheduler.settings import QueueSettings
from llmswap.scheduler.swappers.group import GroupSwapper
from llmswap.scheduler.types import ProcessStopped, ServeDone, StopDone, SwapDone, Swapper, Unload
from tests.unit.scheduler.fakes import FakeEffects, ManualClock, RequestFactory, ScriptedSwapper

STOPPED = ProcessState.STOPPED
READY = ProcessState.READY


class World:
    """One scheduler with its fakes; `req(...)` builds and submits a request."""

    def __init__(
        self,
        states: Mapping[str, ProcessState],
        evict: Mapping[str, Sequence[str]] | None = None,
        *,
        swapper: Swapper | None = None,
        limits: Mapping[str, int] | None = None,
        priority: Mapping[str, int] | None = None,
    ) -> None:
        self.clock = ManualClock()
        self.effects = FakeEffects(states)
        self.swapper = swapper or ScriptedSwapper(evict)
        self.requests = RequestFactory(self.clock)
        self.sched = FifoScheduler(
            "test",
            self.swapper,
            self.effects,
            settings=QueueSettings(limits=limits or {}, priority=priority or {}),
            clock=self.clock,
        )

    def req(self, model: str, *, priority: int = 0):
        r = self.requests.make(model, priority=priority)
        self.sched.on_request(r)
        return r

    def queued_models(self) -> list[str]:
        return [r.model for r in self.sched.books.queue]

    def swap_done(self, model: str, error=None) -> None:
        self.effects.complete_swap(self.sched, model, error)

    def serve_done(self, req) -> None:
        self.effects.finish_serving(self.sched, req)


# ================================================================ llama-swap's fifo_test.go


def test_fifo_fast_path():
    w = World({"a": READY})
    r = w.req("a")
    assert w.effects.starts_for("a") == 0
    assert w.effects.was_served(r)


def test_fifo_model_not_found():
    w = World({})
    r = w.req("ghost")
    assert w.effects.starts == []
    assert isinstance(w.effects.error_of(r), ModelNotFound)
    assert w.effects.admitted == []  # rejected before admission: nothing reserved
    assert w.sched.books.reserved == {}


def test_fifo_on_demand_start_then_serve():
    w = World({"a": STOPPED})
    r = w.req("a")
    assert w.effects.starts_for("a") == 1
    assert w.effects.is_pending(r)
    w.swap_done("a")
    assert w.effects.was_served(r)


def test_fifo_join_in_flight_swap():
    w = World({"a": STOPPED})
    rs = [w.req("a") for _ in range(3)]
    assert w.effects.starts_for("a") == 1
    w.swap_done("a")
    assert all(w.effects.was_served(r) for r in rs)


def test_fifo_swap_done_error_fails_all_waiters():
    w = World({"a": STOPPED})
    rs = [w.req("a"), w.req("a")]
    boom = SwapFailed("boom")
    w.swap_done("a", boom)
    assert w.effects.served("a") == 0
    assert [w.effects.error_of(r) for r in rs] == [boom, boom]
    assert w.sched.books.reserved == {}


def test_fifo_queue_on_eviction_collision():
    w = World({"a": STOPPED, "b": STOPPED}, {"b": ["a"]})
    ra = w.req("a")
    w.req("b")
    assert w.effects.starts_for("b") == 0
    w.swap_done("a")  # a is granted and now serving
    assert w.effects.starts_for("b") == 0
    w.serve_done(ra)
    assert w.effects.starts_for("b") == 1
    assert w.effects.last_start("b").evict == ("a",)


def test_fifo_disjoint_swaps_run_in_parallel():
    w = World({"a": STOPPED, "b": STOPPED})
    w.req("a")
    w.req("b")
    assert (w.effects.starts_for("a"), w.effects.starts_for("b")) == (1, 1)


def test_fifo_overlapping_evict_sets_do_not_run_in_parallel():
    w = World({"a": STOPPED, "b": STOPPED, "x": READY}, {"a": ["x"], "b": ["x"]})
    w.req("a")
    w.req("b")
    assert w.effects.starts_for("a") == 1
    assert w.effects.starts_for("b") == 0
    w.swap_done("a")  # x is stopped by a's swap
    assert w.effects.starts_for("b") == 1


def test_fifo_queue_drain_promotes_multiple():
    w = World({"a": STOPPED, "b": STOPPED, "c": STOPPED}, {"a": ["b", "c"]})
    w.req("a")
    w.req("b")
    w.req("c")
    assert w.effects.starts_for("b") == w.effects.starts_for("c") == 0
    w.swap_done("a")
    assert w.effects.starts_for("b") == w.effects.starts_for("c") == 1
    assert w.effects.served("a") == 1


def test_fifo_queue_collation():
    w = World(
        {m: STOPPED for m in "abc"},
        {"a": ["b", "c"], "b": ["a", "c"], "c": ["a", "b"]},
    )
    reqs = [w.req(m) for m in "abcabc"]
    for model in "abc":
        w.swap_done(model)
        for r in reqs:
            if r.model == model:
                w.effects.finish_serving(w.sched, r)
    for model in "abc":
        assert w.effects.starts_for(model) == 1
        assert w.effects.served(model) == 2


def test_fifo_no_swap_while_serving():
    w = World({"a": READY, "b": STOPPED}, {"b": ["a"]})
    ra1 = w.req("a")
    ra2 = w.req("a")
    w.req("b")
    assert w.effects.starts_for("b") == 0
    w.serve_done(ra1)
    assert w.effects.starts_for("b") == 0
    w.serve_done(ra2)
    assert w.effects.starts_for("b") == 1


def test_fifo_grant_serve_false_does_not_leak_in_flight():
    w = World({"a": STOPPED, "b": STOPPED}, {"b": ["a"]})
    w.effects.refuse_serve.add("a")  # a's caller is gone by grant time
    w.req("a")
    w.swap_done("a")
    assert w.sched.books.in_flight == {}
    w.req("b")
    assert w.effects.starts_for("b") == 1


def test_fifo_on_shutdown_fails_all_waiters():
    w = World({m: STOPPED for m in "abc"}, {"c": ["a", "b"]})
    reqs = [w.req("a"), w.req("a"), w.req("b"), w.req("b"), w.req("c")]
    err = ShuttingDown("test is shutting down")
    w.sched.on_shutdown(err)
    assert [w.effects.error_of(r) for r in reqs] == [err] * 5
    assert w.sched.books.reserved == {}


def test_fifo_on_unload_releases_active_waiters():
    w = World({"a": STOPPED})
    reqs = [w.req("a"), w.req("a")]
    w.sched.on_unload(Unload(("a",), 1.0))
    for r in reqs:
        err = w.effects.error_of(r)
        assert isinstance(err, ModelUnloaded) and err.message == "test: model unloaded"
    assert [(s.models, s.timeout) for s in w.effects.stops] == [(("a",), 1.0)]


def test_fifo_on_unload_drops_queued_requests():
    w = World({"a": STOPPED, "b": STOPPED}, {"b": ["a"]})
    ra = w.req("a")
    rb = w.req("b")
    w.sched.on_unload(Unload(("b",), 1.0))
    assert isinstance(w.effects.error_of(rb), ModelUnloaded)
    assert w.effects.starts_for("b") == 0
    assert w.effects.is_pending(ra)  # a's swap is untouched


def test_fifo_priority_queue_order():
    w = World(
        {m: STOPPED for m in ["z", "A", "B", "C", "D"]},
        {"z": ["A", "B", "C", "D"]},
        priority={"A": 10, "B": 5, "C": 5, "D": 1},
    )
    w.req("z")
    for model in ["B", "D", "C", "A"]:
        w.req(model)
    assert w.queued_models() == ["A", "B", "C", "D"]


def test_fifo_on_cancel_queued_request():
    w = World({"a": STOPPED, "b": STOPPED}, {"b": ["a"]})
    w.req("a")
    rb = w.req("b")
    assert w.queued_models() == ["b"]
    w.sched.on_cancel(rb)
    assert w.queued_models() == []
    w.swap_done("a")
    assert w.effects.starts_for("b") == 0
    assert w.effects.grants_for(rb) == []  # nobody answers a client that left


def test_fifo_on_cancel_swap_waiter():
    w = World({"a": STOPPED})
    live = w.req("a")
    cancelled = w.req("a")
    assert len(w.sched.books.active["a"].waiters) == 2
    w.sched.on_cancel(cancelled)
    assert len(w.sched.books.active["a"].waiters) == 1
    w.swap_done("a")
    assert w.effects.was_served(live)
    assert w.effects.grants_for(cancelled) == []
    assert w.sched.books.in_flight == {"a": 1}


def test_fifo_on_cancel_not_present():
    w = World({"a": READY})
    r = w.req("a")
    w.sched.on_cancel(r)  # already granted: a no-op
    assert w.effects.served("a") == 1
    assert w.sched.books.queue == []
    assert w.sched.books.reserved == {"a": 1}  # still serving: the reservation ends with ServeDone


def test_fifo_concurrency_limit_rejects_over_limit():
    w = World({"a": READY}, limits={"a": 1})
    r1 = w.req("a")
    assert w.effects.was_served(r1)
    r2 = w.req("a")
    err = w.effects.error_of(r2)
    assert isinstance(err, ConcurrencyLimit)
    assert err.status == 429 and err.retry_after == 1.0
    assert r2 not in w.effects.admitted  # rejected before admission
    w.effects.finish_serving(w.sched, r1)
    r3 = w.req("a")
    assert w.effects.was_served(r3)


def test_fifo_concurrency_limit_default_is_ten():
    w = World({"a": READY})
    first = [w.req("a") for _ in range(10)]
    assert all(w.effects.was_served(r) for r in first)
    eleventh = w.req("a")
    assert isinstance(w.effects.error_of(eleventh), ConcurrencyLimit)


def test_fifo_concurrency_limit_custom_limit():
    w = World({"a": READY}, limits={"a": 2})
    r1, r2, r3 = w.req("a"), w.req("a"), w.req("a")
    assert w.effects.was_served(r1) and w.effects.was_served(r2)
    assert isinstance(w.effects.error_of(r3), ConcurrencyLimit)
    assert w.effects.served("a") == 2


def test_fifo_concurrency_limit_counts_what_a_predecessor_router_still_serves():
    # After a config reload the old router finishes its requests beside the new one: the limit is shared.
    w = World({"a": READY}, limits={"a": 2})
    w.effects.inherited["a"] = 1
    r1 = w.req("a")
    assert w.effects.was_served(r1)
    assert isinstance(w.effects.error_of(w.req("a")), ConcurrencyLimit)
    w.effects.inherited["a"] = 0  # the old router's request finished
    assert w.effects.was_served(w.req("a"))


def test_fifo_concurrency_limit_swap_waiters():
    w = World({"a": STOPPED}, limits={"a": 2})
    r1, r2, r3 = w.req("a"), w.req("a"), w.req("a")
    assert isinstance(w.effects.error_of(r3), ConcurrencyLimit)
    assert w.effects.starts_for("a") == 1
    assert w.sched.books.active["a"].waiters == [r1, r2]
    w.swap_done("a")
    assert w.effects.served("a") == 2
    assert w.effects.errored("a") == 1


def test_fifo_concurrency_limit_queued_waiters_reserve_capacity():
    w = World({"a": STOPPED, "b": STOPPED}, {"a": ["b"]}, limits={"a": 2})
    rb = w.req("b")
    ra1, ra2, ra3 = w.req("a"), w.req("a"), w.req("a")
    assert isinstance(w.effects.error_of(ra3), ConcurrencyLimit)
    assert w.queued_models() == ["a", "a"]
    assert w.effects.starts_for("a") == 0
    w.swap_done("b")
    w.effects.finish_serving(w.sched, rb)
    assert w.effects.starts_for("a") == 1
    w.swap_done("a")
    assert w.effects.was_served(ra1) and w.effects.was_served(ra2)


def test_fifo_concurrency_limit_cancelled_queued_waiter_releases_reservation():
    w = World({"a": STOPPED, "b": STOPPED}, {"a": ["b"]}, limits={"a": 1})
    w.req("b")
    cancelled = w.req("a")
    rejected = w.req("a")
    assert isinstance(w.effects.error_of(rejected), ConcurrencyLimit)
    w.sched.on_cancel(cancelled)
    retry = w.req("a")
    assert retry in w.effects.admitted
    assert w.sched.books.queue == [retry]


# ================================================================ our contracts


def test_fifo_grant_serve_false_releases_the_reservation():
    w = World({"a": READY}, limits={"a": 1})
    w.effects.refuse_serve.add("a")
    w.req("a")
    assert w.sched.books.reserved == {} and w.sched.books.in_flight == {}
    w.effects.refuse_serve.clear()
    again = w.req("a")
    assert w.effects.was_served(again)


def test_fifo_grant_serve_false_for_one_joined_waiter_counts_only_the_others():
    w = World({"a": STOPPED})
    r1, r2, r3 = w.req("a"), w.req("a"), w.req("a")
    w.effects.gone.add(r2)  # left between joining and the grant, before its cancel arrived
    w.swap_done("a")
    assert w.sched.books.in_flight == {"a": 2}
    assert w.sched.books.reserved == {"a": 2}
    w.sched.on_cancel(r2)  # the late cancel finds nothing to do
    w.effects.finish_serving(w.sched, r1)
    w.effects.finish_serving(w.sched, r3)
    assert w.sched.books.in_flight == {} and w.sched.books.reserved == {}


def test_fifo_admit_false_drops_the_request():
    w = World({"a": STOPPED}, limits={"a": 1})
    r = w.requests.make("a")
    w.effects.gone.add(r)
    w.sched.on_request(r)
    assert w.effects.starts == [] and w.effects.grants == []
    assert w.sched.books.reserved == {}
    assert w.effects.was_served(w.req("a")) is False  # a fresh request is admitted and starts a swap
    assert w.effects.starts_for("a") == 1


def test_fifo_cancel_while_queued_moves_the_others_up():
    w = World({m: STOPPED for m in "zabc"}, {"z": ["a", "b", "c"]})
    w.req("z")
    ra, rb, rc = w.req("a"), w.req("b"), w.req("c")
    assert [w.effects.last_position(r) for r in (ra, rb, rc)] == [1, 2, 3]
    w.sched.on_cancel(ra)
    assert [w.effects.last_position(r) for r in (rb, rc)] == [1, 2]
    assert w.effects.positions[rb] == [2, 1]
    assert w.sched.books.reserved == {"z": 1, "b": 1, "c": 1}


def test_fifo_positions_are_sent_only_when_they_change():
    w = World({m: STOPPED for m in "zab"}, {"z": ["a", "b"]}, priority={"b": 1})
    w.req("z")
    ra = w.req("a")
    rb = w.req("b")  # higher model priority: jumps ahead of a
    assert w.effects.positions[ra] == [1, 2]
    assert w.effects.positions[rb] == [1]
    w.req("a")  # lands behind: nobody else moves
    assert w.effects.positions[ra] == [1, 2]
    assert w.effects.positions[rb] == [1]


def test_fifo_per_request_priority_orders_requests_for_the_same_model_priority():
    w = World({m: STOPPED for m in "zab"}, {"z": ["a", "b"]})
    w.req("z")
    low = w.req("a", priority=-10)
    normal = w.req("b")
    high = w.req("a", priority=5)
    also_high = w.req("b", priority=5)
    assert w.sched.books.queue == [high, also_high, normal, low]


def test_fifo_model_priority_outranks_request_priority():
    w = World({m: STOPPED for m in "zab"}, {"z": ["a", "b"]}, priority={"a": 1})
    w.req("z")
    urgent_b = w.req("b", priority=100)
    plain_a = w.req("a")
    assert w.sched.books.queue == [plain_a, urgent_b]


def test_fifo_unload_while_loading():
    w = World({"a": STOPPED, "b": STOPPED}, {"b": ["a"]})
    r1, r2 = w.req("a"), w.req("a")
    w.effects.states["a"] = ProcessState.STARTING
    w.sched.on_unload(Unload(("a",), None))
    assert isinstance(w.effects.error_of(r1), ModelUnloaded)
    assert isinstance(w.effects.error_of(r2), ModelUnloaded)
    assert [s.models for s in w.effects.stops] == [("a",)]
    assert w.sched.snapshot().loading == ()

    # A new request for a waits: a is being stopped and its old swap has not reported yet.
    again = w.req("a")
    assert w.effects.starts_for("a") == 1 and w.effects.is_pending(again)
    # b would evict a, which is stopping: it waits too.
    rb = w.req("b")
    assert w.effects.starts_for("b") == 0

    # The dropped swap reports (aborted by the stop): nobody hears about it.
    w.swap_done("a", SwapFailed("a exited while loading"))
    assert len(w.effects.grants_for(r1)) == 1 and len(w.effects.grants_for(again)) == 0
    assert w.effects.starts_for("a") == 1  # still stopping

    w.effects.complete_stop(w.sched)
    # Drained in arrival order: a starts again; b collides with that swap and keeps waiting.
    assert w.effects.starts_for("a") == 2
    assert w.effects.last_start("a").rule == RULE_DRAIN
    assert w.effects.starts_for("b") == 0
    w.swap_done("a")
    assert w.effects.was_served(again)
    w.effects.finish_serving(w.sched, again)
    assert w.effects.starts_for("b") == 1
    w.swap_done("b")
    assert w.effects.was_served(rb)


def test_fifo_swap_done_after_stop_done_for_an_unloaded_swap():
    w = World({"a": STOPPED})
    r = w.req("a")
    w.sched.on_unload(Unload(("a",), 2.0))
    w.effects.complete_stop(w.sched)
    again = w.req("a")
    assert w.effects.starts_for("a") == 1 and w.effects.is_pending(again)  # old swap still winding down
    w.sched.on_swap_done(SwapDone("a", SwapFailed("stopped while loading")))
    assert w.effects.starts_for("a") == 2
    assert isinstance(w.effects.error_of(r), ModelUnloaded)
    assert w.effects.is_pending(again)


def test_fifo_requests_during_a_stop_are_queued_then_served():
    w = World({"a": READY, "b": STOPPED}, {"b": ["a"]})
    w.sched.on_unload(Unload(("a",), 5.0))
    w.effects.states["a"] = ProcessState.STOPPING
    ra = w.req("a")
    rb = w.req("b")
    assert w.queued_models() == ["a", "b"]
    assert w.effects.starts == [] and w.effects.grants == []
    w.effects.complete_stop(w.sched)
    # a starts; b would evict a's swap in progress and waits for it.
    assert w.effects.starts_for("a") == 1 and w.effects.starts_for("b") == 0
    w.swap_done("a")
    assert w.effects.was_served(ra)
    w.effects.finish_serving(w.sched, ra)
    assert w.effects.last_start("b").evict == ("a",)
    w.swap_done("b")
    assert w.effects.was_served(rb)


def test_fifo_a_ready_model_being_unloaded_is_not_served():
    w = World({"a": READY})
    w.sched.on_unload(Unload(("a",), None))
    r = w.req("a")  # the router has not flipped a to stopping yet
    assert w.effects.is_pending(r)
    w.effects.complete_stop(w.sched)
    assert w.effects.starts_for("a") == 1


def test_fifo_unload_keeps_in_flight_counts_for_their_serve_done():
    w = World({"a": READY, "b": STOPPED}, {"b": ["a"]})
    ra = w.req("a")
    w.sched.on_unload(Unload(("a",), None))
    assert w.sched.books.in_flight == {"a": 1}
    w.effects.complete_stop(w.sched)
    rb = w.req("b")  # a is stopped but its killed request has not posted ServeDone yet
    assert w.effects.starts_for("b") == 0
    w.effects.finish_serving(w.sched, ra)
    assert w.effects.starts_for("b") == 1
    assert w.effects.is_pending(rb)


def test_fifo_abort_unwanted_load():
    w = World({"a": STOPPED, "b": STOPPED}, {"b": ["a"]})
    ra = w.req("a")
    rb = w.req("b")  # collides with a's swap: queued
    w.sched.on_cancel(ra)  # a's only waiter leaves, and b is blocked by a's load
    assert w.effects.aborts == ["a"]
    assert w.effects.starts_for("b") == 0  # a's swap has not reported yet

    ra2 = w.req("a")  # must not join the aborted swap: it would inherit its error
    assert w.sched.books.active["a"].waiters == []
    w.swap_done("a", SwapFailed("loading a was aborted"))
    assert w.effects.errored() == 0
    # Drained in order: b (arrived first) starts, evicting a; a's new request waits behind it.
    assert w.effects.starts_for("b") == 1
    assert w.effects.starts_for("a") == 1
    assert w.effects.is_pending(ra2)
    w.swap_done("b")
    assert w.effects.was_served(rb)


def test_fifo_no_abort_when_no_queued_request_needs_it():
    w = World({"a": STOPPED, "c": STOPPED}, {"b": ["a"]})
    ra = w.req("a")
    w.req("c")  # unrelated, started in parallel
    w.sched.on_cancel(ra)
    assert w.effects.aborts == []
    w.swap_done("a")  # it kept loading; nobody to serve
    assert w.effects.grants_for(ra) == []
    assert w.sched.books.in_flight == {}
    assert "a" not in w.sched.books.active


def test_fifo_abort_when_a_request_arrives_behind_an_unwanted_load():
    w = World({"a": STOPPED, "b": STOPPED}, {"b": ["a"]})
    ra = w.req("a")
    w.sched.on_cancel(ra)
    assert w.effects.aborts == []  # nothing needs it gone yet: it keeps loading
    rb = w.req("b")  # now something does
    assert w.effects.aborts == ["a"]
    w.swap_done("a", SwapFailed("loading a was aborted"))
    assert w.effects.last_start("b").evict == ("a",)
    assert w.effects.errored() == 0 and w.effects.is_pending(rb)


def test_fifo_no_abort_while_other_waiters_remain():
    w = World({"a": STOPPED, "b": STOPPED}, {"b": ["a"]})
    ra1, ra2 = w.req("a"), w.req("a")
    w.req("b")
    w.sched.on_cancel(ra1)
    assert w.effects.aborts == []
    w.swap_done("a")
    assert w.effects.was_served(ra2)


def test_fifo_aborted_load_that_finished_anyway_serves_the_queue():
    w = World({"a": STOPPED, "b": STOPPED}, {"b": ["a"]})
    ra = w.req("a")
    rb = w.req("b")
    w.sched.on_cancel(ra)
    ra2 = w.req("a")
    w.swap_done("a")  # the abort came too late: a is ready
    assert w.effects.errored() == 0
    # b goes first (arrival order) and evicts the idle a; a's new request waits for that swap.
    assert w.effects.last_start("b").evict == ("a",)
    assert w.effects.is_pending(ra2) and w.effects.is_pending(rb)


def test_fifo_process_stopped_drains_the_queue():
    groups = {"g": GroupConfig("g", members=("a", "b")), DEFAULT_GROUP_ID: GroupConfig(DEFAULT_GROUP_ID)}
    w = World({"a": READY, "b": STOPPED}, swapper=GroupSwapper(groups))
    w.req("a")  # serving
    rb = w.req("b")  # would evict the busy a
    assert w.effects.starts == []
    w.effects.states["a"] = STOPPED  # a crashed
    w.sched.on_process_stopped(ProcessStopped("a", unexpected=True, exit_code=139))
    assert w.effects.last_start("b").evict == ()
    assert w.effects.is_pending(rb)


def test_fifo_cannot_fit_errors_the_request():
    swapper = ScriptedSwapper(cannot_fit={"huge": "huge needs 80 GiB, budget 24 GiB"})
    w = World({"huge": STOPPED}, swapper=swapper)
    r = w.req("huge")
    err = w.effects.error_of(r)
    assert isinstance(err, CannotFit) and "80 GiB" in err.message
    assert w.effects.starts == [] and w.sched.books.reserved == {}


def test_fifo_shutdown_refuses_later_requests():
    w = World({"a": READY})
    err = ShuttingDown("test is shutting down")
    w.sched.on_shutdown(err)
    r = w.req("a")
    assert w.effects.error_of(r) is err
    assert w.effects.admitted == []


def test_fifo_swap_plan_names_its_rule_and_request():
    w = World({"a": READY, "b": STOPPED}, {"b": ["a"]})
    ra = w.req("a")
    w.clock.advance(2.5)
    rb = w.req("b")
    w.clock.advance(1.0)
    w.effects.finish_serving(w.sched, ra)
    plan = w.effects.last_start("b")
    assert (plan.evict, plan.rule, plan.request_seq) == (("a",), RULE_DRAIN, rb.seq)
    assert "waited 1.0s" in plan.detail
    w2 = World({"x": STOPPED})
    rx = w2.req("x")
    assert w2.effects.last_start("x").rule == RULE_REQUEST
    assert w2.effects.last_start("x").request_seq == rx.seq


def test_fifo_swapper_sees_running_models_and_swaps_in_progress():
    w = World({"a": READY, "b": STOPPED, "c": STOPPED, "d": ProcessState.STARTING})
    w.req("b")
    w.req("c")
    assert w.swapper.swap_starts == [("b", ("a", "d")), ("c", ("a", "b", "d"))]


def test_fifo_ready_target_evicting_others_swaps_instead_of_fast_path():
    w = World({"a": READY, "b": READY}, {"a": ["b"]})
    r = w.req("a")
    assert w.effects.last_start("a").evict == ("b",)
    assert w.effects.is_pending(r)


def test_fifo_target_being_evicted_by_a_swap_in_progress_waits():
    w = World({"a": STOPPED, "x": READY}, {"a": ["x"]})
    w.req("a")
    rx = w.req("x")  # ready, evicts nothing, but a's swap is stopping it
    assert w.effects.is_pending(rx)
    w.swap_done("a")
    assert w.effects.starts_for("x") == 1


def test_fifo_serve_done_without_a_grant_is_ignored(caplog):
    w = World({"a": READY})
    with caplog.at_level(logging.WARNING):
        w.sched.on_serve_done(ServeDone("a", w.requests.make("a")))
    assert w.sched.books.in_flight == {} and "nothing in flight" in caplog.text


def test_fifo_stop_done_counts_overlapping_unloads():
    w = World({"a": READY})
    w.sched.on_unload(Unload(("a",), None))
    w.sched.on_unload(Unload(("a",), None))
    r = w.req("a")
    w.sched.on_stop_done(StopDone(("a",)))
    assert w.effects.is_pending(r) and w.effects.starts == []
    w.effects.states["a"] = STOPPED
    w.sched.on_stop_done(StopDone(("a",)))
    assert w.effects.starts_for("a") == 1


def test_fifo_unknown_model_in_the_queue_is_answered_on_drain():
    w = World({"a": STOPPED, "b": STOPPED}, {"b": ["a"]})
    w.req("a")
    rb = w.req("b")
    del w.effects.states["b"]  # the router no longer handles b
    w.swap_done("a")
    assert isinstance(w.effects.error_of(rb), ModelNotFound)
    assert w.sched.books.reserved == {"a": 1}


def test_fifo_snapshot():
    w = World({"a": READY, "b": STOPPED, "c": STOPPED}, {"b": ["a"], "c": ["a"]})
    ra = w.req("a")
    w.req("c")
    w.req("b")
    w.req("b")
    snap = w.sched.snapshot()
    assert dict(snap.waiting) == {"c": 1, "b": 2}
    assert dict(snap.in_flight) == {"a": 1}
    assert snap.loading == ()
    w.serve_done(ra)
    snap = w.sched.snapshot()
    assert snap.loading == ("c",)
    assert dict(snap.waiting) == {"c": 1, "b": 2}
    assert w.sched.next_deadline() is None


def test_fifo_logs_committed_swaps_at_info(caplog):
    w = World({"a": READY, "b": STOPPED}, {"b": ["a"]})
    with caplog.at_level(logging.INFO, logger="llmswap.scheduler"):
        w.req("b")
    assert "swap: start b evict [a] rule=fifo.request" in caplog.text


@pytest.mark.parametrize("limit", [0, -3])
def test_fifo_non_positive_limit_means_the_default(limit):
    w = World({"a": READY}, limits={"a": limit})
    for _ in range(10):
        w.req("a")
    assert w.effects.served("a") == 10
    assert isinstance(w.effects.error_of(w.req("a")), ConcurrencyLimit)


# ================================================================ swap phases: drain, prefetch


def test_fifo_a_swap_that_waits_for_its_victims_requests_carries_its_drain_and_prefetches_meanwhile():
    w = World({"a": READY, "b": STOPPED}, evict={"b": ["a"]})
    serving = w.req("a")
    assert w.effects.was_served(serving)
    w.req("b")
    assert w.effects.starts_for("b") == 0
    assert w.effects.prefetches == [("prefetch", "b")]  # read while a's request ends
    w.clock.advance(2.5)
    w.serve_done(serving)
    plan = w.effects.last_start("b")
    assert plan is not None and plan.drain == 2.5 and plan.drained == ("a",)
    assert w.effects.prefetches == [("prefetch", "b")]  # the swap owns the read now: not cancelled
    assert w.sched.books.draining == {} and w.sched.books.prefetching is None


def test_fifo_a_swap_with_nothing_in_flight_has_no_drain():
    w = World({"a": READY, "b": STOPPED}, evict={"b": ["a"]})
    w.req("b")
    plan = w.effects.last_start("b")
    assert plan is not None and plan.drain is None and plan.drained == ()
    assert w.effects.prefetches == []  # the router reads b's files as the swap starts


def test_fifo_the_prefetch_is_cancelled_when_the_waiting_request_leaves():
    w = World({"a": READY, "b": STOPPED}, evict={"b": ["a"]})
    serving = w.req("a")
    waiting = w.req("b")
    w.sched.on_cancel(waiting)
    assert w.effects.prefetches == [("prefetch", "b"), ("cancel", "b")]
    assert w.sched.books.draining == {}
    w.serve_done(serving)
    assert w.effects.starts_for("b") == 0
