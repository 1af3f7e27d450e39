"""Backlog hints: a task lane's one request at the router carries the depth of its type's durable queue.

The batch scheduler counts the hint in its model's depth (the deepest task queue loads first among models
of equal priority); both schedulers keep a model whose request announced more until its next one came
(within `ANNOUNCED_GRACE`, and maxWait), and FIFO keeps arrival order. Driven event by event against
FakeEffects and a manual clock; one model at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmswap.config.model import DEFAULT_GROUP_ID, BatchSettings, GroupConfig
from llmswap.process.state import ProcessState
from llmswap.scheduler.arrivals import DEFAULT_CLOSEDNESS, ArrivalRates
from llmswap.scheduler.batch import RULE_DEEPEST, BatchScheduler
from llmswap.scheduler.books import ANNOUNCED_GRACE
from llmswap.scheduler.estimates import ServiceTimes
from llmswap.scheduler.fifo import FifoScheduler
from llmswap.scheduler.idle import GRACE_MAX
from llmswap.scheduler.swappers.group import GroupSwapper
from llmswap.scheduler.types import HandlerRequest, Scheduler
from tests.unit.scheduler.fakes import FakeEffects, ManualClock, RequestFactory, advance

LOAD = 5.0


class World:
    """Models `c` (loaded), `a` and `b`, one at a time; `closedness`: the arrival measure's starting point."""

    def __init__(self, *, fifo: bool = False, closedness: float = DEFAULT_CLOSEDNESS, max_wait: float = 30.0,
                 min_residency: float = 1.0) -> None:
        models: Sequence[str] = ("a", "b", "c")
        self.clock = ManualClock()
        self.effects = FakeEffects({"a": ProcessState.STOPPED, "b": ProcessState.STOPPED,
                                    "c": ProcessState.READY})
        self.requests = RequestFactory(self.clock)
        swapper = GroupSwapper({DEFAULT_GROUP_ID: GroupConfig(DEFAULT_GROUP_ID, members=tuple(models))})
        self.sched: Scheduler
        if fifo:
            self.sched = FifoScheduler("test", swapper, self.effects, clock=self.clock)
        else:
            self.sched = BatchScheduler(
                "test", swapper, self.effects, clock=self.clock,
                batch=BatchSettings(max_wait=max_wait, min_residency=min_residency),
                times=ServiceTimes(default_service=1.0, default_load=LOAD),
                rates=ArrivalRates(default_closedness=closedness),
            )

    def req(self, model: str, backlog: int = 0) -> HandlerRequest:
        r = self.requests.make(model, backlog=backlog)
        self.sched.on_request(r)
        return r

    def advance(self, seconds: float) -> None:
        advance(self.sched, self.clock, seconds)

    def started(self) -> list[str]:
        return [plan.model for plan in self.effects.starts]


def two_task_types_queued_behind_c(world: World) -> HandlerRequest:
    """`c` serves an interactive request; the lanes of two task types ask for `a` (2 queued in all: one
    request, one behind it) and then `b` (5 in all) while it does."""
    busy = world.req("c")
    assert world.effects.was_served(busy)
    world.req("a", backlog=1)
    world.req("b", backlog=4)
    assert world.started() == []
    return busy


def test_batch_loads_the_model_of_the_deepest_task_queue_first() -> None:
    world = World(closedness=1.0)
    busy = two_task_types_queued_behind_c(world)
    world.effects.finish_serving(world.sched, busy)
    world.advance(GRACE_MAX)  # c's clients did not come back
    assert world.started() == ["b"]  # depth 5 beats depth 2, though a's request came first
    assert world.effects.starts[0].rule == RULE_DEEPEST


def test_batch_without_hints_loads_the_oldest_of_equal_depths() -> None:
    world = World(closedness=1.0)
    busy = world.req("c")
    world.req("a")
    world.req("b")
    world.effects.finish_serving(world.sched, busy)
    world.advance(GRACE_MAX)
    assert world.started() == ["a"]


def test_fifo_keeps_arrival_order_whatever_the_backlog() -> None:
    world = World(fifo=True)
    busy = two_task_types_queued_behind_c(world)
    world.effects.finish_serving(world.sched, busy)
    assert world.started() == ["a"]


def test_batch_serves_an_announced_backlog_before_swapping() -> None:
    # Open-loop by the arrival measure (the production start): only the hint holds the model.
    world = World()
    first = world.req("c", backlog=2)
    waiting = world.req("b")
    world.effects.finish_serving(world.sched, first)
    world.advance(0.2)  # the lane claims its next task from the database
    second = world.req("c", backlog=1)
    assert world.effects.was_served(second) and world.started() == []
    world.effects.finish_serving(world.sched, second)
    world.advance(0.2)
    last = world.req("c", backlog=0)
    assert world.effects.was_served(last) and world.started() == []
    assert world.effects.is_pending(waiting)
    world.effects.finish_serving(world.sched, last)  # the lane's queue is empty: nothing more is announced
    world.advance(GRACE_MAX)
    assert world.started() == ["b"]


def test_batch_holds_a_model_whose_announced_request_never_comes_no_longer_than_max_wait() -> None:
    world = World(max_wait=3.0, min_residency=1.0)
    first = world.req("c", backlog=5)
    waiting = world.req("b")
    world.effects.finish_serving(world.sched, first)
    world.advance(2.0)
    assert world.started() == []  # c's backlog is on its way
    world.advance(1.5)  # b waited past maxWait: its model goes, announced backlog or not
    assert world.started() == ["b"]
    assert world.effects.is_pending(waiting)  # it waits on the swap now


def test_batch_holds_a_model_whose_backlog_grew_while_its_request_ran() -> None:
    # The lane's first task went out with nothing behind it; two more were queued before it finished.
    world = World()
    first = world.req("c", backlog=0)
    world.req("b")
    world.effects.finish_serving(world.sched, first, backlog=2)
    world.advance(0.2)
    assert world.started() == []
    second = world.req("c", backlog=1)
    assert world.effects.was_served(second)


def test_fifo_serves_an_announced_next_request_before_evicting_its_model() -> None:
    world = World(fifo=True)
    first = world.req("c", backlog=1)
    waiting = world.req("b")
    world.effects.finish_serving(world.sched, first)
    world.advance(0.2)
    assert world.started() == []
    last = world.req("c", backlog=0)
    assert world.effects.was_served(last)
    world.effects.finish_serving(world.sched, last)
    assert world.started() == ["b"]  # nothing more announced: the queue goes on in arrival order
    assert world.effects.is_pending(waiting)


def test_fifo_evicts_a_model_whose_announced_request_never_came_after_the_grace() -> None:
    world = World(fifo=True)
    first = world.req("c", backlog=3)
    world.req("b")
    world.effects.finish_serving(world.sched, first)
    world.advance(ANNOUNCED_GRACE / 2)
    assert world.started() == []
    world.advance(ANNOUNCED_GRACE)
    assert world.started() == ["b"]
