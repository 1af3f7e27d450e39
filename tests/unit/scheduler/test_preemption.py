"""Preemption of background work in both schedulers, against FakeEffects and a manual clock (no loop).

One exclusive slot. `bg` serves background work (priority -10, like tasks); an interactive request
(priority 0) for `chat` needs the slot. With `preemptBelow: 0` the background requests in flight are
preempted (Effects.preempt), `bg` takes no new background request, and `chat` loads as soon as their
ServeDones arrive. Without it, or when anything at or above the bound is in flight, it waits.
"""

from __future__ import annotations

import logging

import pytest

from llmswap.config.model import DEFAULT_GROUP_ID, BatchSettings, GroupConfig
from llmswap.process.state import ProcessState
from llmswap.scheduler.arrivals import ArrivalRates
from llmswap.scheduler.batch import BatchScheduler
from llmswap.scheduler.core import QueueScheduler
from llmswap.scheduler.estimates import ServiceTimes
from llmswap.scheduler.fifo import FifoScheduler
from llmswap.scheduler.preemption import REASON_PRIORITY
from llmswap.scheduler.settings import QueueSettings
from llmswap.scheduler.swappers.group import GroupSwapper
from llmswap.scheduler.types import HandlerRequest
from tests.unit.scheduler.fakes import FakeEffects, ManualClock, RequestFactory

TASK = -10
MODELS = ("bg", "chat")


class World:
    def __init__(self, kind: str, *, preempt_below: int | None = 0, closed: bool = True) -> None:
        self.clock = ManualClock()
        self.effects = FakeEffects(dict.fromkeys(MODELS, ProcessState.STOPPED))
        self.requests = RequestFactory(self.clock)
        swapper = GroupSwapper({DEFAULT_GROUP_ID: GroupConfig(DEFAULT_GROUP_ID, members=MODELS)})
        common = dict(clock=self.clock, times=ServiceTimes(default_service=1.0, default_load=2.0),
                      settings=QueueSettings(preempt_below=preempt_below),
                      logger=logging.getLogger("test.preemption"))
        self.sched: QueueScheduler
        if kind == "batch":
            # A task worker is a closed loop: without preemption batch would hold `bg` for it.
            self.sched = BatchScheduler("test", swapper, self.effects, batch=BatchSettings(),
                                        rates=ArrivalRates(default_closedness=1.0 if closed else 0.0),
                                        **common)
        else:
            self.sched = FifoScheduler("test", swapper, self.effects, **common)

    def req(self, model: str, priority: int) -> HandlerRequest:
        r = self.requests.make(model, priority=priority)
        self.sched.on_request(r)
        return r

    def background(self, count: int = 3) -> list[HandlerRequest]:
        tasks = [self.req("bg", TASK) for _ in range(count)]
        self.effects.complete_swap(self.sched, "bg", duration=2.0)
        assert all(self.effects.was_served(t) for t in tasks)
        return tasks

    def end(self, req: HandlerRequest) -> None:
        """The router ended a preempted request: its ServeDone arrives."""
        self.effects.finish_serving(self.sched, req)


@pytest.mark.parametrize("kind", ["fifo", "batch"])
def test_an_interactive_request_preempts_background_work_and_loads_after_it_ends(kind):
    w = World(kind)
    tasks = w.background()
    chat = w.req("chat", 0)
    assert [r for r, _ in w.effects.preempted] == tasks
    assert all("preemptBelow" in message for _, message in w.effects.preempted)
    assert w.sched.stats.preempted == {REASON_PRIORITY: 3}
    assert w.effects.starts_for("chat") == 0, "the slot is still held until the preempted requests end"
    for t in tasks:
        w.end(t)
    plan = w.effects.last_start("chat")
    assert plan is not None and plan.evict == ("bg",)
    w.effects.complete_swap(w.sched, "chat", duration=2.0)
    assert w.effects.was_served(chat)


@pytest.mark.parametrize("kind", ["fifo", "batch"])
def test_a_model_being_preempted_takes_no_new_background_request(kind):
    w = World(kind)
    tasks = w.background(2)
    w.req("chat", 0)
    late_task = w.req("bg", TASK)  # the task worker's next request arrives meanwhile
    assert w.effects.is_pending(late_task)
    for t in tasks:
        w.end(t)
    assert w.effects.last_start("chat") is not None
    assert len(w.effects.preempted) == 2, "each request is preempted once"


@pytest.mark.parametrize("kind", ["fifo", "batch"])
def test_interactive_work_in_the_way_is_never_preempted(kind):
    w = World(kind)
    w.req("bg", 0)
    w.effects.complete_swap(w.sched, "bg", duration=2.0)
    w.req("chat", 5)
    assert w.effects.preempted == [] and w.sched.stats.preempted == {}


@pytest.mark.parametrize("kind", ["fifo", "batch"])
def test_a_model_serving_both_kinds_is_waited_for(kind):
    w = World(kind)
    w.background(1)
    w.req("bg", 0)  # an interactive request joins the loaded model
    w.req("chat", 0)
    assert w.effects.preempted == []


@pytest.mark.parametrize("kind", ["fifo", "batch"])
def test_without_preempt_below_background_work_is_waited_for(kind):
    w = World(kind, preempt_below=None)
    w.background()
    w.req("chat", 10)
    assert w.effects.preempted == []


def test_raising_the_bound_makes_interactive_work_preemptible_by_higher_priority():
    w = World("fifo", preempt_below=5)
    first = w.req("bg", 0)
    w.effects.complete_swap(w.sched, "bg", duration=2.0)
    w.req("chat", 0)
    assert w.effects.preempted == [], "priority 0 may not preempt (below the bound itself)"
    w.req("chat", 5)
    assert [r for r, _ in w.effects.preempted] == [first]


def test_a_preemptor_that_leaves_releases_the_hold_on_its_victim():
    w = World("fifo")
    (task,) = w.background(1)
    chat = w.req("chat", 0)
    w.sched.on_cancel(chat)  # the interactive client gave up
    w.end(task)
    nxt = w.req("bg", TASK)
    assert w.effects.was_served(nxt), "nobody needs bg emptied any more"
    assert w.effects.starts_for("chat") == 0
