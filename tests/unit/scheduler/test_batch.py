"""BatchScheduler driven event by event against FakeEffects and a manual clock: no loop, no processes.

Unless a test says otherwise every model shares one exclusive slot (one model loaded at a time),
service times default to 1 s and loads to 5 s until observed, and every model's clients count as a
closed loop until measured otherwise (holding pays: `closed=True`); `closed=False` starts from the
production default, where batch behaves as FIFO until holding is measured to pay.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from llmswap.config.model import DEFAULT_GROUP_ID, BatchSettings, GroupConfig
from llmswap.process.state import ProcessState
from llmswap.scheduler.arrivals import DEFAULT_CLOSEDNESS, ArrivalRates
from llmswap.scheduler.batch import (
    RULE_DEEPEST,
    RULE_FREE,
    RULE_IDLE,
    RULE_MAX_WAIT,
    RULE_NO_GAIN,
    BatchScheduler,
)
from llmswap.scheduler.errors import ModelNotFound, ModelUnloaded, ShuttingDown, SwapFailed
from llmswap.scheduler.estimates import ServiceTimes
from llmswap.scheduler.idle import GRACE_DEFAULT, GRACE_MIN
from llmswap.scheduler.settings import QueueSettings
from llmswap.scheduler.swappers.group import GroupSwapper
from llmswap.scheduler.types import HandlerRequest, ProcessStopped, Swapper, Unload
from tests.unit.scheduler.fakes import FakeEffects, ManualClock, RequestFactory, ScriptedSwapper, advance

STOPPED = ProcessState.STOPPED
READY = ProcessState.READY
LOAD = 5.0
THINK = 0.05


def one_slot(models: Sequence[str]) -> GroupSwapper:
    return GroupSwapper({DEFAULT_GROUP_ID: GroupConfig(DEFAULT_GROUP_ID, members=tuple(models))})


class World:
    def __init__(
        self,
        models: Sequence[str] | Mapping[str, ProcessState],
        *,
        max_wait: float = 30.0,
        min_residency: float = 10.0,
        priority: Mapping[str, int] | None = None,
        swapper: Swapper | None = None,
        limits: Mapping[str, int] | None = None,
        closed: bool = True,
    ) -> None:
        states = dict(models) if isinstance(models, Mapping) else dict.fromkeys(models, STOPPED)
        self.clock = ManualClock()
        self.effects = FakeEffects(states)
        self.requests = RequestFactory(self.clock)
        self.settings = BatchSettings(max_wait=max_wait, min_residency=min_residency)
        self.sched = BatchScheduler(
            "test", swapper or one_slot(list(states)), self.effects,
            settings=QueueSettings(limits=limits or {}, priority=priority or {}), batch=self.settings,
            clock=self.clock,
            times=ServiceTimes(default_service=1.0, default_load=LOAD),
            rates=ArrivalRates(default_closedness=1.0 if closed else DEFAULT_CLOSEDNESS),
        )

    def req(self, model: str, *, priority: int = 0) -> HandlerRequest:
        r = self.requests.make(model, priority=priority)
        self.sched.on_request(r)
        return r

    def advance(self, seconds: float) -> int:
        return advance(self.sched, self.clock, seconds)

    def swap_done(self, model: str, error=None, duration: float = LOAD) -> None:
        self.effects.complete_swap(self.sched, model, error, duration)

    def serve_done(self, req: HandlerRequest) -> None:
        self.effects.finish_serving(self.sched, req)

    def load(self, model: str) -> HandlerRequest:
        """Request `model` with nothing in the way, let it load (LOAD seconds) and be served."""
        r = self.req(model)
        self.advance(LOAD)
        self.swap_done(model)
        assert self.effects.was_served(r)
        return r

    def agent_turn(self, model: str, previous: HandlerRequest, service: float = 1.0) -> HandlerRequest:
        """A closed-loop client: its answer finishes after `service`, it thinks, it asks again."""
        self.advance(service)
        self.serve_done(previous)
        self.advance(THINK)
        return self.req(model)

    def queued(self) -> list[str]:
        return [r.model for r in self.sched.books.queue]


# ================================================================ batching


def test_batch_keeps_serving_a_model_whose_client_keeps_coming_back():
    w = World("ab")
    ra = w.load("a")
    rb = w.req("b")
    for _ in range(5):
        ra = w.agent_turn("a", ra)
        assert w.effects.was_served(ra), "a closed-loop client's next request is served at once"
    assert w.effects.starts_for("b") == 0 and w.effects.is_pending(rb)


def test_batch_fifo_would_have_swapped_on_the_same_events():
    """The trap: between two requests of a closed-loop client its model has nothing in flight or queued."""
    w = World("ab")
    ra = w.load("a")
    w.req("b")
    w.advance(1.0)
    w.serve_done(ra)
    assert w.sched.books.in_flight == {} and w.queued() == ["b"]
    assert w.effects.starts_for("b") == 0  # not idle yet: its client may come back within the grace


def test_batch_before_holding_is_measured_to_pay_swaps_when_fifo_would():
    w = World("ab", closed=False)
    ra = w.load("a")
    rb = w.req("b")
    w.advance(1.0)
    w.serve_done(ra)
    plan = w.effects.last_start("b")
    assert plan is not None and plan.rule == RULE_NO_GAIN and plan.evict == ("a",)
    assert plan.request_seq == rb.seq


def test_batch_without_holding_keeps_serving_the_loaded_models_newcomers_like_fifo():
    w = World("ab", closed=False)
    ra = w.load("a")
    w.req("b")
    late_a = w.req("a")  # a still has a request in flight: no room is made, as in FIFO
    assert w.effects.was_served(late_a) and w.effects.starts_for("b") == 0
    w.advance(1.0)
    w.serve_done(ra)
    assert w.effects.starts_for("b") == 0, "a is still serving its newcomer"
    w.serve_done(late_a)
    assert w.effects.last_start("b").rule == RULE_NO_GAIN


def test_batch_learns_closed_loops_from_the_first_exchange():
    w = World("ab", closed=False)
    ra, rb = w.load("a"), w.req("b")
    w.advance(1.0)
    w.serve_done(ra)  # FIFO's way: b goes at once, a is evicted
    assert w.effects.last_start("b").rule == RULE_NO_GAIN
    assert w.sched.rates.hold_factor("b", w.clock.now) == 0.0
    w.advance(THINK)
    ra = w.req("a")  # a's client answers 50 ms later, and then waits for a: the workload is closed loops
    assert w.sched.rates.hold_factor("b", w.clock.now) == 1.0, "b, unmeasured, is presumed a closed loop"
    w.advance(LOAD)
    w.swap_done("b")
    starts = len(w.effects.starts)
    for _ in range(5):
        rb = w.agent_turn("b", rb)
        assert w.effects.was_served(rb), "b keeps its model while its client comes back"
    assert len(w.effects.starts) == starts and w.effects.is_pending(ra)


def test_a_quick_return_of_a_client_that_sent_overlapping_requests_proves_nothing():
    w = World("ab", closed=False)
    ra = w.req("a")
    ra2 = w.req("a")  # two at once: open-loop traffic, not one agent waiting for each answer
    w.advance(LOAD)
    w.swap_done("a")
    w.req("b")
    w.advance(1.0)
    w.serve_done(ra)
    w.serve_done(ra2)
    assert w.effects.last_start("b").evict == ("a",)
    w.advance(THINK)
    w.req("a")
    assert w.sched.rates.hold_factor("b", w.clock.now) == 0.0


def test_batch_idle_model_gives_way_after_its_grace():
    w = World("ab")
    ra = w.load("a")
    rb = w.req("b")
    w.advance(1.0)
    w.serve_done(ra)
    finished = w.clock.now
    assert w.sched.next_deadline() == finished + GRACE_DEFAULT
    w.advance(GRACE_DEFAULT)
    plan = w.effects.last_start("b")
    assert plan is not None and plan.rule == RULE_IDLE and plan.evict == ("a",)
    assert plan.request_seq == rb.seq


def test_batch_idle_grace_is_learned_from_the_clients_think_time():
    w = World("ab")
    ra = w.load("a")
    for _ in range(3):
        ra = w.agent_turn("a", ra)
    assert w.sched.gaps.grace("a") == GRACE_MIN  # 3 x 50 ms, raised to the floor
    w.req("b")
    w.advance(1.0)
    w.serve_done(ra)
    w.advance(GRACE_MIN)
    assert w.effects.last_start("b").rule == RULE_IDLE


def test_batch_a_freshly_loaded_model_that_is_idle_may_be_evicted_before_min_residency():
    w = World("ab", min_residency=60.0)
    ra = w.load("a")
    w.advance(1.0)
    w.serve_done(ra)
    w.req("b")
    w.advance(GRACE_DEFAULT)
    assert w.effects.starts_for("b") == 1  # idle: minResidency does not protect it


def test_batch_a_model_whose_waiters_all_left_is_idle_at_once():
    w = World("ab")
    ra = w.req("a")
    w.advance(LOAD)
    w.effects.gone.add(ra)
    w.swap_done("a")  # nobody to serve: never finished a request
    rb = w.req("b")
    assert w.effects.last_start("b").rule == RULE_IDLE
    assert w.effects.is_pending(rb)


def test_batch_max_wait_makes_the_loaded_model_give_way():
    w = World("ab", max_wait=30.0, min_residency=0.0)
    ra = w.load("a")
    rb = w.req("b")
    switch_at = w.sched.next_deadline()
    assert switch_at is not None and switch_at <= rb.arrived + 30.0
    served_a = 1
    while w.effects.starts_for("b") == 0:
        ra = w.agent_turn("a", ra)
        if w.effects.was_served(ra):
            served_a += 1
    assert served_a > 10, "a keeps serving its client for most of b's maxWait"
    plan = w.effects.last_start("b")
    assert plan.rule == RULE_MAX_WAIT and plan.evict == ("a",)
    started = w.clock.now
    assert started <= rb.arrived + 30.0, "the swap starts within maxWait of b's arrival"
    assert w.effects.is_pending(ra), "a's last request arrived while a was making room: it waits"


def test_batch_a_model_making_room_takes_no_new_requests_but_finishes_its_own():
    w = World("ab", max_wait=10.0, min_residency=0.0)
    ra = w.load("a")
    rb = w.req("b")
    w.advance(w.sched.next_deadline() - w.clock.now)
    assert w.sched.books.holds("a")
    late = w.req("a")
    assert w.effects.is_pending(late) and w.queued() == ["b", "a"]
    assert w.effects.starts_for("b") == 0, "a busy model is never evicted"
    w.serve_done(ra)
    assert w.effects.last_start("b").rule == RULE_MAX_WAIT
    assert w.queued() == ["a"]
    w.advance(LOAD)
    w.swap_done("b")
    w.advance(1.0)
    w.serve_done(rb)
    w.advance(GRACE_DEFAULT)  # at the latest, b's client is gone now
    assert w.effects.starts_for("a") == 2
    w.advance(LOAD)
    w.swap_done("a")
    assert w.effects.was_served(late)


def test_batch_min_residency_prevents_ping_pong():
    def swaps_with(min_residency: float) -> int:
        w = World("ab", max_wait=1.0, min_residency=min_residency)
        ra, rb = w.load("a"), w.req("b")
        active = {"a": ra, "b": rb}
        for _ in range(40):  # both clients come back at once; each answer takes 1 s
            for m, r in list(active.items()):
                if r in w.sched.books.granted:
                    w.advance(1.0)
                    w.serve_done(r)
                    w.advance(THINK)
                    active[m] = w.req(m)
            for m in "ab":
                if m in w.sched.books.active:
                    w.advance(LOAD)
                    w.swap_done(m)
        return len(w.effects.starts)

    assert swaps_with(0.0) >= 20, "maxWait below the load time alone: a swap for nearly every request"
    assert swaps_with(10.0) <= 8, "minResidency keeps each model loaded long enough to batch"


def test_batch_min_residency_delays_a_due_model():
    w = World("ab", max_wait=1.0, min_residency=10.0)
    ra = w.load("a")
    loaded_at = w.clock.now
    w.req("b")
    while w.effects.starts_for("b") == 0:
        ra = w.agent_turn("a", ra)
    assert w.clock.now >= loaded_at + 10.0


def test_batch_never_evicts_a_busy_model():
    w = World("ab", max_wait=0.0, min_residency=0.0)
    ra = w.load("a")
    w.req("b")
    w.advance(100.0)
    assert w.effects.starts_for("b") == 0
    w.serve_done(ra)
    assert w.effects.last_start("b").rule == RULE_MAX_WAIT


# ================================================================ which model goes next


def idle_a_with_queues(w: World, queues: Sequence[tuple[str, int]]) -> None:
    """a is loaded and serving one request while other models' requests queue; then a goes idle."""
    ra = w.load("a")
    for model, priority in queues:
        w.req(model, priority=priority)
        w.advance(0.01)
    w.serve_done(ra)
    w.advance(GRACE_DEFAULT)


def test_batch_picks_the_deepest_queue_when_the_loaded_model_goes_idle():
    w = World("abc")
    idle_a_with_queues(w, [("c", 0), ("b", 0), ("b", 0), ("b", 0)])
    plan = w.effects.starts[-1]
    assert (plan.model, plan.rule) == ("b", RULE_DEEPEST)
    assert "b=3" in plan.detail and "c=1" in plan.detail
    w.advance(LOAD)
    w.swap_done("b")
    assert w.effects.served("b") == 3


def test_batch_age_of_the_oldest_request_raises_its_score():
    w = World("abc", max_wait=300.0)
    ra = w.load("a")
    rc = w.req("c")
    w.req("c")
    while w.clock.now < rc.arrived + 200.0:  # a's client keeps a busy while c's requests age
        ra = w.agent_turn("a", ra)
    for _ in range(3):
        w.req("b")  # 3 fresh requests: 3 x 1.0 loses to c's 2 x (1 + 200/300)
    w.advance(1.0)
    w.serve_done(ra)
    w.advance(GRACE_DEFAULT)
    plan = w.effects.starts[-1]
    assert (plan.model, plan.rule) == ("c", RULE_DEEPEST)


def test_batch_model_priority_comes_before_queue_depth():
    w = World("abc", priority={"c": 10})
    idle_a_with_queues(w, [("b", 0), ("b", 0), ("b", 0), ("c", 0)])
    assert w.effects.starts[-1].model == "c"


def test_batch_request_priority_comes_before_queue_depth():
    # The server fills priority from X-Priority or the API key's default; both arrive here as req.priority.
    w = World("abc")
    idle_a_with_queues(w, [("b", 0), ("b", 0), ("b", 0), ("c", 5)])
    assert w.effects.starts[-1].model == "c"


def test_batch_request_priority_orders_the_queue_within_model_priority():
    w = World("abc", priority={"b": 1})
    w.load("a")
    low_c = w.req("c", priority=-5)  # e.g. a batch-jobs API key's default
    header_c = w.req("c", priority=7)  # e.g. X-Priority: 7
    plain_b = w.req("b")
    assert w.sched.books.queue == [plain_b, header_c, low_c]
    assert [w.effects.last_position(r) for r in (plain_b, header_c, low_c)] == [1, 2, 3]


def test_batch_ties_go_to_the_oldest_then_to_the_model_id():
    w = World("abc")
    idle_a_with_queues(w, [("c", 0), ("b", 0)])
    assert w.effects.starts[-1].model == "c"  # same depth and priority: c's request is older
    w2 = World("abc")
    ra = w2.load("a")
    w2.req("c")
    w2.req("b")  # same clock reading
    w2.serve_done(ra)
    w2.advance(GRACE_DEFAULT)
    assert w2.effects.starts[-1].model == "b"


def test_batch_best_score_gives_way_when_it_would_make_another_miss_max_wait():
    w = World("abc", max_wait=30.0)
    ra = w.load("a")
    rb = w.req("b")
    while w.clock.now < rb.arrived + 25.0:
        ra = w.agent_turn("a", ra)
    for _ in range(5):
        w.req("c")  # deeper, but loading c first (5 s + 10 s residency) would keep b past its deadline
    w.advance(1.0)
    w.serve_done(ra)
    w.advance(w.sched.gaps.grace("a"))
    plan = w.effects.starts[-1]
    assert (plan.model, plan.rule) == ("b", RULE_DEEPEST)


# ================================================================ what FIFO does, batch does too


def test_batch_swaps_that_evict_nothing_start_at_once_and_in_parallel():
    w = World("ab", swapper=ScriptedSwapper())
    w.req("a")
    w.req("b")
    assert [(p.model, p.rule) for p in w.effects.starts] == [("a", RULE_FREE), ("b", RULE_FREE)]


def test_batch_requests_join_a_swap_in_progress():
    w = World("a")
    rs = [w.req("a") for _ in range(3)]
    assert w.effects.starts_for("a") == 1
    w.swap_done("a")
    assert all(w.effects.was_served(r) for r in rs)
    assert w.sched.books.in_flight == {"a": 3}


def test_batch_in_flight_counts_only_received_grants():
    w = World("ab")
    w.effects.refuse_serve.add("a")
    w.req("a")
    w.swap_done("a")
    assert w.sched.books.in_flight == {} and w.sched.books.reserved == {}
    w.req("b")
    assert w.effects.starts_for("b") == 1  # a never served anyone: idle


def test_batch_aborts_a_load_nobody_waits_for_when_another_model_waits():
    w = World("ab")
    ra = w.req("a")
    rb = w.req("b")
    w.sched.on_cancel(ra)
    assert w.effects.aborts == ["a"]
    w.swap_done("a", SwapFailed("loading a was aborted"))
    assert w.effects.errored() == 0
    plan = w.effects.last_start("b")
    assert plan is not None and plan.request_seq == rb.seq


def test_batch_unknown_model():
    w = World("a")
    r = w.req("ghost")
    assert isinstance(w.effects.error_of(r), ModelNotFound)


def test_batch_unload_answers_waiters_and_stops():
    w = World("ab")
    w.load("a")
    rb1, rb2 = w.req("b"), w.req("b")
    w.sched.on_unload(Unload(("b",), 2.0))
    assert all(isinstance(w.effects.error_of(r), ModelUnloaded) for r in (rb1, rb2))
    assert [s.models for s in w.effects.stops] == [("b",)]
    assert w.sched.books.queue == []


def test_batch_shutdown_fails_every_waiter_and_refuses_new_requests():
    w = World("ab")
    w.load("a")
    rb = w.req("b")
    err = ShuttingDown("test is shutting down")
    w.sched.on_shutdown(err)
    assert w.effects.error_of(rb) is err
    assert w.effects.error_of(w.req("a")) is err


def test_batch_process_stopped_lets_the_queue_move():
    w = World("ab")
    ra = w.load("a")
    rb = w.req("b")
    w.effects.states["a"] = STOPPED  # a crashed
    w.sched.on_process_stopped(ProcessStopped("a", unexpected=True, exit_code=139))
    assert w.effects.last_start("b").rule == RULE_FREE
    w.serve_done(ra)  # its handler still reports the killed request
    assert w.effects.is_pending(rb)


def test_batch_snapshot_counts_queued_and_joined_waiters():
    w = World("abc")
    ra = w.load("a")
    w.req("b")
    w.req("b")
    w.req("c")
    snap = w.sched.snapshot()
    assert dict(snap.waiting) == {"b": 2, "c": 1}
    assert dict(snap.in_flight) == {"a": 1}
    assert snap.loading == ()
    w.advance(1.0)
    w.serve_done(ra)
    w.advance(GRACE_DEFAULT)
    snap = w.sched.snapshot()
    assert snap.loading == ("b",)
    assert dict(snap.waiting) == {"b": 2, "c": 1}
    assert dict(snap.in_flight) == {}


def test_batch_swap_plan_says_why_and_is_logged(caplog):
    w = World("abc")
    ra = w.load("a")
    w.req("b")
    w.advance(2.0)
    w.req("c")
    w.serve_done(ra)
    with caplog.at_level(logging.INFO, logger="llmswap.scheduler"):
        w.advance(GRACE_DEFAULT)
    plan = w.effects.starts[-1]
    assert plan.rule == RULE_DEEPEST and plan.evict == ("a",)
    assert "waited 2.5s" in plan.detail
    assert "b=1 (oldest 2.5s)" in plan.detail and "c=1 (oldest 0.5s)" in plan.detail
    assert "evict a (resident" in plan.detail and "last request 0.5s ago" in plan.detail
    assert "swap: start b evict [a] rule=batch.deepest_queue" in caplog.text


def test_batch_timer_is_only_armed_for_the_future():
    w = World("ab")
    ra = w.load("a")
    w.req("b")
    for _ in range(20):
        deadline = w.sched.next_deadline()
        assert deadline is None or deadline > w.clock.now
        ra = w.agent_turn("a", ra)
