"""`try_grant_now`, the router's fast path, in both schedulers against FakeEffects: no loop, no processes.

Each scenario builds two identical worlds. One offers the newcomer to `try_grant_now` (and, when it declines,
to `on_request`, as the router does); its twin hands it straight to `on_request`. Whatever the scenario, the
two must make the same `Effects` calls and keep the same books, then and after the newcomer's ServeDone: the
fast path is only ever a shortcut to the decision `on_request` takes. The expected answer of `try_grant_now`
says which scenarios it takes (a ready, free model) and which it leaves to the queue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pytest

from llmswap.config.model import DEFAULT_GROUP_ID, BatchSettings, GroupConfig
from llmswap.process.state import ProcessState
from llmswap.scheduler.arrivals import ArrivalRates
from llmswap.scheduler.batch import BatchScheduler
from llmswap.scheduler.core import QueueScheduler
from llmswap.scheduler.errors import ShuttingDown
from llmswap.scheduler.estimates import ServiceTimes
from llmswap.scheduler.fifo import FifoScheduler
from llmswap.scheduler.settings import QueueSettings
from llmswap.scheduler.swappers.group import GroupSwapper
from llmswap.scheduler.types import HandlerRequest, Unload
from tests.unit.scheduler.fakes import FakeEffects, ManualClock, RequestFactory, ScriptedSwapper, advance

STOPPED = ProcessState.STOPPED
READY = ProcessState.READY
TASK = -10
KINDS = ("fifo", "batch")


class World:
    """One scheduler of `kind` over models a, b (one exclusive slot unless `swapper` says otherwise)."""

    def __init__(self, kind: str, states: Mapping[str, ProcessState], *,
                 limits: Mapping[str, int] | None = None, key_limits: Mapping[str, int] | None = None,
                 preempt_below: int | None = None, swapper: ScriptedSwapper | None = None) -> None:
        self.clock = ManualClock()
        self.effects = FakeEffects(states)
        self.requests = RequestFactory(self.clock)
        self.swapper = swapper
        slot = GroupSwapper({DEFAULT_GROUP_ID: GroupConfig(DEFAULT_GROUP_ID, members=tuple(sorted(states)))})
        settings = QueueSettings(limits=limits or {}, key_limits=key_limits or {},
                                 preempt_below=preempt_below)
        common = dict(settings=settings, clock=self.clock,
                      times=ServiceTimes(default_service=1.0, default_load=2.0),
                      logger=logging.getLogger("test.grant_now"))
        self.sched: QueueScheduler
        if kind == "batch":
            self.sched = BatchScheduler("test", swapper or slot, self.effects,
                                        batch=BatchSettings(max_wait=10.0, min_residency=0.0),
                                        rates=ArrivalRates(default_closedness=1.0), **common)
        else:
            self.sched = FifoScheduler("test", swapper or slot, self.effects, **common)

    def req(self, model: str, *, priority: int = 0, api_key: str | None = None,
            deadline_in: float | None = None) -> HandlerRequest:
        r = self.requests.make(model, priority=priority, api_key=api_key, deadline_in=deadline_in)
        self.sched.on_request(r)
        return r

    def load(self, model: str, *, priority: int = 0) -> HandlerRequest:
        """Request `model`, let its swap finish; the request is served and stays in flight."""
        r = self.req(model, priority=priority)
        self.effects.complete_swap(self.sched, model, duration=2.0)
        assert self.effects.was_served(r)
        return r

    def trace(self) -> list[tuple[str, object]]:
        """Every Effects call so far, requests named by their seq (the twins' requests are other objects)."""
        out: list[tuple[str, object]] = []
        for name, arg in self.effects.calls:
            if isinstance(arg, HandlerRequest):
                arg = arg.seq
            elif isinstance(arg, tuple) and arg and isinstance(arg[0], HandlerRequest):
                arg = (arg[0].seq, *arg[1:])
            out.append((name, arg))
        return out

    def books(self) -> tuple[object, ...]:
        s = self.sched
        extra: tuple[object, ...] = ()
        if isinstance(s, BatchScheduler):
            extra = (s._making_room, repr(vars(s.rates)), repr(vars(s.gaps)))
        return (s.snapshot(), dict(s.books.reserved), dict(s.books.key_reserved),
                sorted((r.seq, at) for r, at in s.books.granted.items()), [r.seq for r in s.books.queue],
                s.next_deadline(), s.stats.rejected if hasattr(s.stats, "rejected") else None, *extra)


@dataclass(frozen=True)
class Newcomer:
    model: str
    priority: int = 0
    api_key: str | None = None
    deadline_in: float | None = None


@dataclass(frozen=True)
class Scenario:
    """A world, what happened in it, the newcomer, and whether `try_grant_now` takes it."""

    name: str
    states: Mapping[str, ProcessState]
    setup: Callable[[World], None]
    newcomer: Newcomer
    fast: dict[str, bool]  # kind -> the expected answer of try_grant_now
    limits: Mapping[str, int] | None = None
    key_limits: Mapping[str, int] | None = None
    preempt_below: int | None = None
    evict: Mapping[str, Sequence[str]] | None = None  # a ScriptedSwapper instead of one slot


def _nothing(w: World) -> None:
    return None


def _a_serving(w: World) -> None:
    w.load("a")


def _a_loading(w: World) -> None:
    w.req("a")


def _a_evicted_for_b(w: World) -> None:
    w.load("a")
    w.effects.finish_serving(w.sched, w.effects.grants[-1].request)
    w.req("b")  # a is idle: b's swap starts, evicting a (still READY until the swap stops it)


def _a_unloading(w: World) -> None:
    w.load("a")
    w.effects.finish_serving(w.sched, w.effects.grants[-1].request)
    w.sched.on_unload(Unload(("a",)))


def _b_queued_behind_a(w: World) -> None:
    w.load("a")
    w.req("b")  # would evict a, which serves: it waits in the queue


def _a_queued_then_room(w: World) -> None:
    """A request of a waits for b (which serves) to be evicted; then a's way clears with no event (memory
    freed behind the scheduler's back, as a vram reading may): the queued request has not been re-read."""
    w.load("b")
    w.req("a")
    assert w.swapper is not None
    w.swapper.evict["a"] = []


def _a_making_room_for_b(w: World) -> None:
    w.load("a")
    w.req("b")
    advance(w.sched, w.clock, 10.0)  # b's maxWait presses: a takes no newcomers (batch)


def _a_preempted_for_b(w: World) -> None:
    w.load("a", priority=TASK)
    w.req("b")  # interactive: a's background request in flight is preempted


def _shut_down(w: World) -> None:
    w.load("a")
    w.sched.on_shutdown(ShuttingDown("test"))


def _a_busy_with_key(w: World) -> None:
    r = w.requests.make("a", api_key="k")
    w.sched.on_request(r)
    w.effects.complete_swap(w.sched, "a")


def _inherited(w: World) -> None:
    w.load("a")
    w.effects.inherited["a"] = 1  # a predecessor router still serves one


BOTH = {"fifo": True, "batch": True}
NEITHER = {"fifo": False, "batch": False}
SCENARIOS = [
    Scenario("ready and idle", {"a": READY, "b": STOPPED}, _nothing, Newcomer("a"), BOTH),
    Scenario("ready and serving, under its limit", {"a": STOPPED, "b": STOPPED}, _a_serving, Newcomer("a"),
             BOTH, limits={"a": 2}),
    Scenario("at its concurrency limit", {"a": STOPPED, "b": STOPPED}, _a_serving, Newcomer("a"), NEITHER,
             limits={"a": 1}),
    Scenario("stopped", {"a": STOPPED, "b": STOPPED}, _nothing, Newcomer("a"), NEITHER),
    Scenario("unknown model", {"a": READY}, _nothing, Newcomer("x"), NEITHER),
    Scenario("loading", {"a": STOPPED, "b": STOPPED}, _a_loading, Newcomer("a"), NEITHER),
    Scenario("being evicted", {"a": STOPPED, "b": STOPPED}, _a_evicted_for_b, Newcomer("a"), NEITHER),
    Scenario("being unloaded", {"a": STOPPED, "b": STOPPED}, _a_unloading, Newcomer("a"), NEITHER),
    Scenario("another model queued", {"a": STOPPED, "b": STOPPED}, _b_queued_behind_a, Newcomer("a"),
             {"fifo": True, "batch": False}),
    Scenario("its own model queued", {"a": STOPPED, "b": STOPPED}, _a_queued_then_room, Newcomer("a"),
             NEITHER, evict={"a": ["b"]}),
    Scenario("making room", {"a": STOPPED, "b": STOPPED}, _a_making_room_for_b, Newcomer("a"),
             {"fifo": True, "batch": False}),
    Scenario("preempted", {"a": STOPPED, "b": STOPPED}, _a_preempted_for_b, Newcomer("a", priority=TASK),
             NEITHER, preempt_below=0),
    Scenario("a deadline to judge", {"a": READY}, _nothing, Newcomer("a", deadline_in=0.5), NEITHER),
    Scenario("its key at maxConcurrent", {"a": STOPPED}, _a_busy_with_key, Newcomer("a", api_key="k"),
             NEITHER, key_limits={"k": 1}),
    Scenario("another key", {"a": STOPPED}, _a_busy_with_key, Newcomer("a", api_key="other"), BOTH,
             key_limits={"k": 1}),
    Scenario("a predecessor's requests at the limit", {"a": STOPPED}, _inherited, Newcomer("a"), NEITHER,
             limits={"a": 2}),
    Scenario("shut down", {"a": STOPPED}, _shut_down, Newcomer("a"), NEITHER),
]


def _world(kind: str, sc: Scenario) -> World:
    swapper = ScriptedSwapper(sc.evict) if sc.evict is not None else None
    w = World(kind, sc.states, limits=sc.limits, key_limits=sc.key_limits, preempt_below=sc.preempt_below,
              swapper=swapper)
    sc.setup(w)
    return w


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda sc: sc.name)
def test_grant_now_decides_exactly_as_on_request(kind: str, sc: Scenario) -> None:
    fast, slow = _world(kind, sc), _world(kind, sc)
    assert fast.trace() == slow.trace() and fast.books() == slow.books()
    before = len(fast.trace())
    n = sc.newcomer
    r_fast = fast.requests.make(n.model, priority=n.priority, api_key=n.api_key, deadline_in=n.deadline_in)
    r_slow = slow.requests.make(n.model, priority=n.priority, api_key=n.api_key, deadline_in=n.deadline_in)
    books = fast.books()
    took = fast.sched.try_grant_now(r_fast)
    assert took is sc.fast[kind]
    if not took:
        assert len(fast.trace()) == before and fast.books() == books, "a declined request changes nothing"
        fast.sched.on_request(r_fast)
    slow.sched.on_request(r_slow)
    assert fast.trace() == slow.trace()
    assert fast.books() == slow.books()
    if took:
        assert fast.trace()[before:] == [("admit", r_fast.seq), ("grant_serve", r_fast.seq)]
        fast.clock.advance(0.5)
        slow.clock.advance(0.5)
        fast.effects.finish_serving(fast.sched, r_fast)
        slow.effects.finish_serving(slow.sched, r_slow)
        assert fast.trace() == slow.trace()
        assert fast.books() == slow.books()


@pytest.mark.parametrize("kind", KINDS)
def test_grant_now_is_counted_in_flight_until_its_serve_done(kind: str) -> None:
    w = World(kind, {"a": READY, "b": STOPPED}, limits={"a": 2})
    first, second, third = (w.requests.make("a") for _ in range(3))
    assert w.sched.try_grant_now(first) and w.sched.try_grant_now(second)
    assert w.sched.snapshot().in_flight == {"a": 2}
    assert not w.sched.accepts("a")
    assert not w.sched.try_grant_now(third), "never past concurrencyLimit"
    w.effects.finish_serving(w.sched, first)
    assert w.sched.snapshot().in_flight == {"a": 1}
    assert w.sched.try_grant_now(third)
    assert w.effects.was_served(third)


@pytest.mark.parametrize("kind", KINDS)
def test_grant_now_keeps_a_busy_model_from_being_evicted(kind: str) -> None:
    w = World(kind, {"a": READY, "b": STOPPED})
    served = w.requests.make("a")
    assert w.sched.try_grant_now(served)
    wants_b = w.req("b")
    assert w.effects.starts_for("b") == 0 and w.effects.is_pending(wants_b), "a fast grant is in flight"
    w.effects.finish_serving(w.sched, served)
    advance(w.sched, w.clock, 10.0)  # batch: b's maxWait (FIFO swaps at once)
    assert w.effects.last_start("b") is not None and w.effects.last_start("b").evict == ("a",)


class CountingSwapper(ScriptedSwapper):
    """A ScriptedSwapper that counts how often placement asks it (the express lane does not)."""

    def __init__(self, evict: Mapping[str, Sequence[str]] | None = None) -> None:
        super().__init__(evict)
        self.asked = 0

    def evictions_for(self, target: str, running: Sequence[str]) -> list[str]:
        self.asked += 1
        return super().evictions_for(target, running)


def test_express_lane_serves_a_run_of_requests_exactly_as_on_request() -> None:
    # Twenty sequential requests, then twenty overlapping ones: the fast world takes each through
    # try_grant_now, its twin through on_request; the Effects calls and the books agree throughout.
    fast = World("fifo", {"a": READY, "b": STOPPED}, limits={"a": 4})
    slow = World("fifo", {"a": READY, "b": STOPPED}, limits={"a": 4})
    held: list[tuple[HandlerRequest, HandlerRequest]] = []
    for index in range(40):
        r_fast, r_slow = fast.requests.make("a"), slow.requests.make("a")
        took = fast.sched.try_grant_now(r_fast)
        if not took:
            fast.sched.on_request(r_fast)
        slow.sched.on_request(r_slow)
        held.append((r_fast, r_slow))
        if index < 20 or len(held) > 3:
            done_fast, done_slow = held.pop(0)
            for world, req in ((fast, done_fast), (slow, done_slow)):
                world.clock.advance(0.25)
                world.effects.finish_serving(world.sched, req)
        assert fast.trace() == slow.trace()
        assert fast.books() == slow.books()
    assert all(fast.effects.was_served(r) for r, _ in held)


def test_express_lane_asks_the_swapper_once_while_nothing_happens() -> None:
    swapper = CountingSwapper({"b": ["a"]})
    w = World("fifo", {"a": READY, "b": STOPPED}, swapper=swapper)
    for _ in range(5):
        req = w.requests.make("a")
        assert w.sched.try_grant_now(req)
        w.effects.finish_serving(w.sched, req)
    assert swapper.asked == 1, "the verdict is kept from one request to the next"
    w.sched.on_request(w.requests.make("b"))  # an event: a swap to b is decided
    assert not w.sched.try_grant_now(w.requests.make("a")), "a swap evicting a is under way"


def test_express_lane_looks_again_when_its_model_stops_without_an_event() -> None:
    w = World("fifo", {"a": READY, "b": STOPPED})
    first = w.requests.make("a")
    assert w.sched.try_grant_now(first)
    w.effects.finish_serving(w.sched, first)
    w.effects.states["a"] = STOPPED  # the process died; its ProcessStopped is not handled yet
    assert not w.sched.try_grant_now(w.requests.make("a"))


def test_express_lane_verdict_is_dropped_when_the_world_changes() -> None:
    swapper = CountingSwapper()
    w = World("fifo", {"a": READY, "b": READY}, swapper=swapper)
    first = w.requests.make("a")
    assert w.sched.try_grant_now(first)
    w.effects.finish_serving(w.sched, first)
    swapper.evict["a"] = ["b"]  # what a process's change of state can do to the swapper's answer
    w.sched.world_changed()
    assert not w.sched.try_grant_now(w.requests.make("a")), "a must evict b now: the queue decides"


def test_express_lane_keeps_every_limit() -> None:
    w = World("fifo", {"a": READY, "b": STOPPED}, limits={"a": 1}, key_limits={"k": 1})
    first = w.requests.make("a")
    assert w.sched.try_grant_now(first)
    assert not w.sched.try_grant_now(w.requests.make("a")), "concurrencyLimit 1, one in flight"
    w.effects.finish_serving(w.sched, first)
    keyed = w.requests.make("a", api_key="k")
    assert w.sched.try_grant_now(keyed)
    w2 = World("fifo", {"a": READY, "b": STOPPED}, limits={"a": 5}, key_limits={"k": 1})
    assert w2.sched.try_grant_now(w2.requests.make("a", api_key="k"))
    assert not w2.sched.try_grant_now(w2.requests.make("a", api_key="k")), "the key's maxConcurrent is 1"
    assert w2.sched.try_grant_now(w2.requests.make("a")), "another key, or none, still has room"


def test_express_lane_leaves_deadlines_to_the_queue() -> None:
    w = World("fifo", {"a": READY, "b": STOPPED})
    first = w.requests.make("a")
    assert w.sched.try_grant_now(first)
    w.effects.finish_serving(w.sched, first)
    assert not w.sched.try_grant_now(w.requests.make("a", deadline_in=5.0))
