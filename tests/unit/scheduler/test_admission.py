"""Admission control, per-key limits and Retry-After estimates, for FIFO and batch alike (shared core).

One exclusive slot: while `a` serves, requests for the other models wait. Estimates start from
known values where a test checks arithmetic (`ServiceTimes` is fed the observations directly;
test_estimates.py checks that the schedulers feed it from their events).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from llmswap.config.model import DEFAULT_GROUP_ID, AdmissionConfig, GroupConfig
from llmswap.process.state import ProcessState
from llmswap.scheduler.admission import (
    REASON_CONCURRENCY,
    REASON_GLOBAL_QUEUE,
    REASON_KEY,
    REASON_MODEL_QUEUE,
    REASON_SHED,
    REASON_TIMEOUT,
    Admission,
)
from llmswap.scheduler.batch import BatchScheduler
from llmswap.scheduler.core import QueueScheduler
from llmswap.scheduler.errors import ConcurrencyLimit, QueueFull, QueueTimeout, Shed
from llmswap.scheduler.estimates import ServiceTimes
from llmswap.scheduler.fifo import FifoScheduler
from llmswap.scheduler.settings import QueueSettings
from llmswap.scheduler.swappers.group import GroupSwapper
from llmswap.scheduler.types import HandlerRequest, ServeDone, SwapDone
from tests.unit.scheduler.fakes import FakeEffects, ManualClock, RequestFactory, advance

KINDS = ["fifo", "batch"]


class World:
    def __init__(
        self,
        kind: str,
        models: Sequence[str] = "abcd",
        *,
        admission: AdmissionConfig | None = None,
        key_limits: Mapping[str, int] | None = None,
        limits: Mapping[str, int] | None = None,
        priority: Mapping[str, int] | None = None,
        times: ServiceTimes | None = None,
    ) -> None:
        self.clock = ManualClock()
        self.effects = FakeEffects(dict.fromkeys(models, ProcessState.STOPPED))
        self.requests = RequestFactory(self.clock)
        self.times = times or ServiceTimes(default_service=1.0, default_load=5.0)
        swapper = GroupSwapper({DEFAULT_GROUP_ID: GroupConfig(DEFAULT_GROUP_ID, members=tuple(models))})
        settings = QueueSettings(limits=limits or {}, priority=priority or {}, admission=admission,
                                 key_limits=key_limits or {})
        common = dict(settings=settings, clock=self.clock, times=self.times)
        self.sched: QueueScheduler
        if kind == "fifo":
            self.sched = FifoScheduler("test", swapper, self.effects, **common)
        else:
            self.sched = BatchScheduler("test", swapper, self.effects, **common)

    def req(self, model: str, *, priority: int = 0, api_key: str | None = None) -> HandlerRequest:
        r = self.requests.make(model, priority=priority, api_key=api_key)
        self.sched.on_request(r)
        return r

    def busy_a(self) -> HandlerRequest:
        """a loaded and serving one request: every other model's requests wait behind it."""
        r = self.req("a")
        self.effects.complete_swap(self.sched, "a", duration=5.0)
        assert self.effects.was_served(r)
        return r

    def advance(self, seconds: float) -> None:
        advance(self.sched, self.clock, seconds)


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


# ================================================================ bounds, policy reject


def test_per_model_bound_rejects_with_429(kind):
    w = World(kind, admission=AdmissionConfig(max_queue_per_model=2))
    w.busy_a()
    waiting = [w.req("b"), w.req("b")]
    rejected = w.req("b")
    err = w.effects.error_of(rejected)
    assert isinstance(err, QueueFull) and err.status == 429 and err.retry_after >= 1
    assert "maxQueuePerModel is 2" in err.message and "b" in err.message
    assert rejected not in w.effects.admitted  # refused before admission: no loading stream starts
    assert all(w.effects.is_pending(r) for r in waiting)
    assert w.sched.stats.rejected == {REASON_MODEL_QUEUE: 1}
    assert w.effects.is_pending(w.req("c"))  # another model's bound is its own


def test_global_bound_rejects_with_503(kind):
    w = World(kind, admission=AdmissionConfig(max_queue=3))
    w.busy_a()
    w.req("b"), w.req("b"), w.req("c")
    err = w.effects.error_of(w.req("d"))
    assert isinstance(err, QueueFull) and err.status == 503
    assert "maxQueue is 3" in err.message
    assert w.sched.stats.rejected == {REASON_GLOBAL_QUEUE: 1}


def test_requests_served_at_once_are_not_waiting(kind):
    w = World(kind, admission=AdmissionConfig(max_queue=1, max_queue_per_model=1))
    w.busy_a()
    w.req("b")  # the one allowed waiter
    more = [w.req("a") for _ in range(4)]  # a is ready and in the way of nothing
    assert all(w.effects.was_served(r) for r in more)
    assert w.sched.stats.rejected == {}


def test_waiters_joined_to_a_swap_count_as_waiting(kind):
    w = World(kind, admission=AdmissionConfig(max_queue_per_model=2))
    w.req("a"), w.req("a")
    err = w.effects.error_of(w.req("a"))
    assert isinstance(err, QueueFull) and err.status == 429
    assert dict(w.sched.snapshot().waiting) == {"a": 2}


# ================================================================ policy shed-lowest


def test_shed_lowest_drops_the_lowest_priority_newest_waiter(kind):
    w = World(kind, admission=AdmissionConfig(max_queue_per_model=3, policy="shed-lowest"))
    w.busy_a()
    keep = w.req("b", priority=0)
    low_old = w.req("b", priority=-1)
    low_new = w.req("b", priority=-1)
    urgent = w.req("b", priority=5)
    err = w.effects.error_of(low_new)
    assert isinstance(err, Shed) and err.status == 503 and err.retry_after >= 1
    assert all(w.effects.is_pending(r) for r in (keep, low_old, urgent))
    assert urgent in w.effects.admitted
    assert w.sched.stats.rejected == {REASON_SHED: 1}
    assert dict(w.sched.snapshot().waiting)["b"] == 3


def test_shed_lowest_refuses_a_newcomer_that_does_not_outrank(kind):
    w = World(kind, admission=AdmissionConfig(max_queue_per_model=2, policy="shed-lowest"))
    w.busy_a()
    first, second = w.req("b", priority=-1), w.req("b", priority=-1)
    equal = w.req("b", priority=-1)
    err = w.effects.error_of(equal)
    assert isinstance(err, QueueFull) and err.status == 429
    assert w.effects.is_pending(first) and w.effects.is_pending(second)
    assert w.sched.stats.rejected == {REASON_MODEL_QUEUE: 1}


def test_shed_lowest_across_models_ranks_model_priority_first(kind):
    w = World(kind, admission=AdmissionConfig(max_queue=2, policy="shed-lowest"), priority={"b": 5})
    w.busy_a()
    c_old, c_new = w.req("c", priority=10), w.req("c", priority=10)
    b = w.req("b")  # model priority 5 outranks c's (0, 10)
    assert isinstance(w.effects.error_of(c_new), Shed)
    assert w.effects.is_pending(c_old) and w.effects.is_pending(b)


def test_shedding_the_last_waiter_of_a_load_aborts_it(kind):
    w = World(kind, admission=AdmissionConfig(max_queue=2, policy="shed-lowest"))
    low = w.req("a", priority=-1)  # a starts loading
    w.req("b")  # waits for a's load to end
    w.req("b", priority=3)
    assert isinstance(w.effects.error_of(low), Shed)
    assert w.effects.aborts == ["a"]


# ================================================================ queue timeout


def test_queue_timeout_answers_waiters_with_503_but_not_requests_being_served(kind):
    w = World(kind, admission=AdmissionConfig(queue_timeout=10.0))
    ra = w.busy_a()
    w.clock.advance(3.0)
    rb = w.req("b")
    assert w.sched.next_deadline() is not None and w.sched.next_deadline() <= rb.arrived + 10.0
    w.advance(10.0)
    err = w.effects.error_of(rb)
    assert isinstance(err, QueueTimeout) and err.status == 503 and err.retry_after >= 1
    assert "queueTimeout is 10s" in err.message
    assert w.effects.grants_for(ra)[0].served and w.effects.error_of(ra) is None
    assert w.sched.stats.rejected == {REASON_TIMEOUT: 1}
    assert w.sched.books.reserved == {"a": 1}


def test_queue_timeout_covers_waiters_joined_to_a_swap(kind):
    w = World(kind, admission=AdmissionConfig(queue_timeout=10.0))
    ra = w.req("a")
    w.advance(10.0)  # the load is slow
    assert isinstance(w.effects.error_of(ra), QueueTimeout)
    assert dict(w.sched.snapshot().waiting) == {}


def test_no_admission_no_timer(kind):
    w = World(kind)
    w.busy_a()
    w.req("a")
    assert w.sched.next_deadline() is None
    assert not w.sched.books.admission.configured


# ================================================================ Retry-After


def measured(service: Mapping[str, float], load: Mapping[str, float]) -> ServiceTimes:
    times = ServiceTimes(default_service=1.0, default_load=5.0)
    for model, seconds in service.items():
        times.observe_service(model, seconds)
    for model, seconds in load.items():
        times.observe_load(model, seconds)
    return times


def test_retry_after_is_the_queue_ahead_times_service_time_plus_the_load(kind):
    def rejected_after(queue: int) -> float:
        times = measured({"a": 1.0, "b": 4.0}, {"a": 5.0, "b": 7.0})
        w = World(kind, admission=AdmissionConfig(max_queue_per_model=queue), times=times)
        w.busy_a()
        for _ in range(queue):
            w.req("b")
        err = w.effects.error_of(w.req("b"))
        assert isinstance(err, QueueFull)
        return err.retry_after

    assert rejected_after(2) == 2 * 4.0 + 7.0
    assert rejected_after(6) == 6 * 4.0 + 7.0


def test_retry_after_follows_how_fast_a_parallel_upstream_gets_through_its_queue(kind):
    times = measured({}, {"b": 7.0})
    w = World(kind, admission=AdmissionConfig(max_queue_per_model=4), times=times)
    # b serves four at once: granted together after its load, finished together 8 s later.
    together = [w.req("b") for _ in range(4)]
    w.effects.complete_swap(w.sched, "b", duration=7.0)
    w.clock.advance(8.0)
    for r in together:
        w.effects.finish_serving(w.sched, r)
    assert w.times.service("b") == 8.0
    assert w.times.per_request("b") == 2.0  # completions 8, 0, 0 and 0 s apart: four per 8 s
    w.advance(600.0)  # long idle: the batch scheduler no longer holds b for returning clients
    w.busy_a()  # b is evicted; its next requests queue behind a
    for _ in range(4):
        w.req("b")
    err = w.effects.error_of(w.req("b"))
    assert isinstance(err, QueueFull)
    assert err.retry_after == 4 * 2.0 + 7.0  # not 4 * 8.0 + 7.0: the four ahead drain in parallel


def test_a_one_at_a_time_upstream_drains_one_request_per_service_time(kind):
    w = World(kind, times=measured({}, {"a": 5.0}))
    first, second = w.req("a"), w.req("a")
    w.effects.complete_swap(w.sched, "a", duration=5.0)
    # llama-server with one slot: both granted, but they finish one after the other.
    w.clock.advance(3.0)
    w.effects.finish_serving(w.sched, first)
    w.clock.advance(3.0)
    w.effects.finish_serving(w.sched, second)
    assert w.times.per_request("a") == 3.0  # while service times were 3 and 6 s
    w.clock.advance(60.0)  # idle time between busy spells is no gap
    third = w.req("a")
    w.clock.advance(3.0)
    w.effects.finish_serving(w.sched, third)
    assert w.times.per_request("a") == 3.0


def test_retry_after_counts_only_what_is_left_of_a_load_in_progress(kind):
    times = measured({"a": 2.0}, {"a": 10.0})
    w = World(kind, admission=AdmissionConfig(max_queue_per_model=2), times=times)
    w.req("a"), w.req("a")
    w.clock.advance(4.0)
    err = w.effects.error_of(w.req("a"))
    assert err.retry_after == 2 * 2.0 + (10.0 - 4.0)


def test_retry_after_is_whole_seconds_and_at_least_one(kind):
    times = measured({"b": 0.1}, {"b": 0.2})
    w = World(kind, admission=AdmissionConfig(max_queue_per_model=1), times=times)
    w.busy_a()
    w.req("b")
    assert w.effects.error_of(w.req("b")).retry_after == 1.0


def test_the_schedulers_measure_service_and_load_times_from_their_events(kind):
    w = World(kind, admission=AdmissionConfig(max_queue_per_model=1))
    ra = w.req("a")
    w.clock.advance(8.0)
    w.sched.on_swap_done(SwapDone("a", None, 8.0))
    w.effects.states["a"] = ProcessState.READY
    w.clock.advance(3.0)
    w.sched.on_serve_done(ServeDone("a", ra))
    assert w.times.service("a") == 3.0 and w.times.load("a") == 8.0
    assert w.times.observed("a") == (1, 1)


# ================================================================ per-key and per-model concurrency


def test_api_key_max_concurrent_rejects_with_429(kind):
    w = World(kind, key_limits={"sk-batch": 2})
    served = w.req("a", api_key="sk-batch")
    w.effects.complete_swap(w.sched, "a")
    waiting = w.req("b", api_key="sk-batch")
    over = w.req("c", api_key="sk-batch")
    err = w.effects.error_of(over)
    assert isinstance(err, ConcurrencyLimit) and err.status == 429 and err.retry_after >= 1
    assert "maxConcurrent" in err.message and "sk-batch" not in err.message  # keys are never echoed
    assert w.effects.was_served(served) and w.effects.is_pending(waiting)
    assert w.effects.is_pending(w.req("c", api_key="sk-other"))
    assert w.effects.is_pending(w.req("c"))
    assert w.sched.stats.rejected == {REASON_KEY: 1}
    w.effects.finish_serving(w.sched, served)
    assert w.req("a", api_key="sk-batch") in w.effects.admitted


def test_api_key_limit_retry_after_is_when_its_first_request_should_finish(kind):
    w = World(kind, key_limits={"k": 1}, times=measured({"a": 4.0}, {"a": 5.0}))
    w.req("a", api_key="k")
    w.effects.complete_swap(w.sched, "a")
    w.clock.advance(1.0)
    assert w.effects.error_of(w.req("a", api_key="k")).retry_after == 3.0


def test_api_key_reservation_ends_on_cancel_error_and_refused_grant(kind):
    w = World(kind, key_limits={"k": 1}, admission=AdmissionConfig(max_queue_per_model=5))
    w.busy_a()
    queued = w.req("b", api_key="k")
    w.sched.on_cancel(queued)
    assert w.sched.books.key_reserved == {}
    w.effects.refuse_serve.add("a")
    w.req("a", api_key="k")  # granted, but the client is gone
    assert w.sched.books.key_reserved == {}


def test_concurrency_limit_retry_after_comes_from_measured_service_time(kind):
    w = World(kind, limits={"a": 1}, times=measured({"a": 6.0}, {"a": 5.0}))
    w.req("a")
    w.effects.complete_swap(w.sched, "a")
    w.clock.advance(2.0)
    err = w.effects.error_of(w.req("a"))
    assert isinstance(err, ConcurrencyLimit) and err.retry_after == 4.0  # llama-swap always says 1
    assert w.sched.stats.rejected == {REASON_CONCURRENCY: 1}


def test_admission_rejects_an_unknown_policy():
    with pytest.raises(ValueError, match=r"admission.policy: unknown policy 'drop'; use one of reject"):
        Admission(AdmissionConfig(policy="drop"))
