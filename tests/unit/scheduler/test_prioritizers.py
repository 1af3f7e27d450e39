"""Prioritizers and deadlines in both schedulers, against FakeEffects and a manual clock (no loop).

One exclusive slot: model `a` is loaded and serving one request, so every request for another model
queues until it finishes; which queued model is loaded first is what the prioritizer decides.
"""

from __future__ import annotations

import logging

import pytest

from llmswap.config.model import DEFAULT_GROUP_ID, BatchSettings, GroupConfig
from llmswap.process.state import ProcessState
from llmswap.scheduler.admission import REASON_DEADLINE
from llmswap.scheduler.arrivals import ArrivalRates
from llmswap.scheduler.batch import BatchScheduler
from llmswap.scheduler.core import QueueScheduler
from llmswap.scheduler.errors import DeadlineMissed
from llmswap.scheduler.estimates import ServiceTimes
from llmswap.scheduler.fifo import FifoScheduler
from llmswap.scheduler.prioritizers import Prioritizer
from llmswap.scheduler.settings import QueueSettings
from llmswap.scheduler.swappers.group import GroupSwapper
from llmswap.scheduler.types import HandlerRequest
from tests.unit.scheduler.fakes import FakeEffects, ManualClock, RequestFactory, advance

MODELS = ("a", "b", "c", "d")


class World:
    def __init__(self, prioritizer: str = "fcfs", *, on_deadline: str = "ignore", kind: str = "fifo",
                 loads: dict[str, float] | None = None) -> None:
        self.clock = ManualClock()
        self.effects = FakeEffects(dict.fromkeys(MODELS, ProcessState.STOPPED))
        self.requests = RequestFactory(self.clock)
        swapper = GroupSwapper({DEFAULT_GROUP_ID: GroupConfig(DEFAULT_GROUP_ID, members=MODELS)})
        times = ServiceTimes(default_service=1.0, default_load=2.0)
        for model, seconds in (loads or {}).items():
            times.observe_load(model, seconds)
        settings = QueueSettings(prioritizer=Prioritizer(prioritizer), on_deadline=on_deadline)
        common = dict(clock=self.clock, times=times, settings=settings,
                      logger=logging.getLogger("test.prioritizers"))
        self.sched: QueueScheduler
        if kind == "batch":
            # maxWait 0: batching never holds a model back here, so the queue order alone decides.
            self.sched = BatchScheduler("test", swapper, self.effects, batch=BatchSettings(max_wait=0.0),
                                        rates=ArrivalRates(default_closedness=0.0), **common)
        else:
            self.sched = FifoScheduler("test", swapper, self.effects, **common)
        self.first = self.req("a")
        self.effects.complete_swap(self.sched, "a", duration=2.0)
        assert self.effects.was_served(self.first)

    def req(self, model: str, *, deadline_in: float | None = None, priority: int = 0) -> HandlerRequest:
        r = self.requests.make(model, deadline_in=deadline_in, priority=priority)
        self.sched.on_request(r)
        return r

    def next_loaded(self) -> str:
        """Let `a` finish its request; the model the scheduler loads next."""
        self.effects.finish_serving(self.sched, self.first)
        plan = self.effects.starts[-1]
        assert plan.evict == ("a",)
        return plan.model


@pytest.mark.parametrize("kind", ["fifo", "batch"])
def test_fcfs_loads_in_arrival_order_whatever_the_deadlines(kind):
    w = World("fcfs", kind=kind)
    w.req("b", deadline_in=60.0)
    w.req("c", deadline_in=10.0)
    assert w.next_loaded() == "b"


@pytest.mark.parametrize("kind", ["fifo", "batch"])
def test_edf_loads_the_earliest_deadline_first(kind):
    w = World("edf", kind=kind)
    w.req("b", deadline_in=60.0)
    w.req("c", deadline_in=10.0)
    w.req("d", deadline_in=30.0)
    assert w.next_loaded() == "c"


def test_edf_puts_requests_without_a_deadline_after_those_with_one():
    w = World("edf")
    w.req("b")
    w.req("c", deadline_in=600.0)
    assert w.next_loaded() == "c"


def test_edf_ties_go_to_the_earlier_arrival():
    w = World("edf")
    w.clock.advance(1.0)
    w.req("c", deadline_in=20.0)
    w.clock.advance(1.0)
    w.req("b", deadline_in=19.0)  # the same absolute deadline, arrived later
    assert w.next_loaded() == "c"


def test_edf_stays_within_the_priority_class():
    w = World("edf")
    w.req("b", deadline_in=600.0, priority=5)
    w.req("c", deadline_in=10.0)
    assert w.next_loaded() == "b"


@pytest.mark.parametrize("kind", ["fifo", "batch"])
def test_lrs_loads_the_least_slack_first_counting_measured_load_times(kind):
    # b's deadline is earlier, but c takes 12 s to load: c has 22 - 12 - 1 = 9 s to spare, b 20 - 1 - 1 = 18.
    w = World("lrs", kind=kind, loads={"b": 1.0, "c": 12.0})
    w.req("b", deadline_in=20.0)
    w.req("c", deadline_in=22.0)
    assert w.next_loaded() == "c"


def test_edf_on_the_same_requests_loads_the_earliest_deadline():
    w = World("edf", loads={"b": 1.0, "c": 12.0})
    w.req("b", deadline_in=20.0)
    w.req("c", deadline_in=22.0)
    assert w.next_loaded() == "b"


def test_a_late_request_is_counted_and_still_served_when_on_deadline_is_ignore():
    w = World("edf")
    late = w.req("b", deadline_in=1.0)  # b must still load (2 s) and be served (1 s)
    assert w.sched.stats.deadline_missed == 1
    assert w.effects.is_pending(late)
    assert w.next_loaded() == "b"
    w.effects.complete_swap(w.sched, "b", duration=2.0)
    assert w.effects.was_served(late)
    assert w.sched.stats.deadline_missed == 1, "counted once"


@pytest.mark.parametrize("kind", ["fifo", "batch"])
def test_on_deadline_reject_answers_a_hopeless_request_503_before_any_swap(kind):
    w = World("edf", on_deadline="reject", kind=kind)
    late = w.req("b", deadline_in=1.0)
    err = w.effects.error_of(late)
    assert isinstance(err, DeadlineMissed) and err.status == 503
    assert "X-Deadline-Ms" in err.message and "onDeadline" in err.message
    assert w.sched.stats.rejected == {REASON_DEADLINE: 1} and w.sched.stats.deadline_missed == 1
    w.effects.finish_serving(w.sched, w.first)
    assert w.effects.starts_for("b") == 0


@pytest.mark.parametrize("kind", ["fifo", "batch"])
def test_a_waiting_request_that_turns_late_is_rejected_on_the_tick_it_does(kind):
    w = World("fcfs", on_deadline="reject", kind=kind)
    waiting = w.req("b", deadline_in=10.0)  # needs 2 s load + 1 s service: late from 7 s on
    assert w.sched.next_deadline() == pytest.approx(w.clock.now + 7.0)
    advance(w.sched, w.clock, 6.9)
    assert w.effects.is_pending(waiting)
    advance(w.sched, w.clock, 0.2)
    assert isinstance(w.effects.error_of(waiting), DeadlineMissed)
    w.effects.finish_serving(w.sched, w.first)
    assert w.effects.starts_for("b") == 0
    assert w.sched.next_deadline() is None


def test_a_request_that_can_make_its_deadline_is_never_counted():
    w = World("lrs", on_deadline="reject")
    r = w.req("b", deadline_in=30.0)
    assert w.next_loaded() == "b"
    w.effects.complete_swap(w.sched, "b", duration=2.0)
    assert w.effects.was_served(r) and w.sched.stats.deadline_missed == 0


def test_unknown_prioritizer_names_the_valid_ones():
    with pytest.raises(ValueError, match="fcfs, edf, lrs"):
        Prioritizer("sjf")
