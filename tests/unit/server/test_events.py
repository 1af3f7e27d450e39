"""The event bus and the feed built on router notifications (no event loop, no processes)."""

from __future__ import annotations

import asyncio
import json

from llmswap.config.model import Config, ModelConfig
from llmswap.process import ProcessEvent
from llmswap.router import BaseRouter, SwapFinished, SwapStarted, build_router
from llmswap.scheduler.errors import SwapFailed
from llmswap.scheduler.types import SwapPlan
from llmswap.server.events import Event, EventBus, EventFeed, Mark, Subscription
from llmswap.server.state import ServerState
from tests.helpers.fake_process import FakeScript, fake_factory
from tests.helpers.wait import eventually


def model(model_id: str, **fields) -> ModelConfig:
    return ModelConfig(id=model_id, cmd=("serve", model_id), proxy="http://127.0.0.1:1", **fields)


def router_for(*models: ModelConfig) -> BaseRouter:
    config = Config(models={m.id: m for m in models})
    return build_router(config, process_factory=fake_factory(FakeScript()))


def feed_for(*models: ModelConfig, **options) -> tuple[ServerState, EventFeed]:
    router = router_for(*models)
    state = ServerState(config=router.config, router=router)
    feed = EventFeed(state, wall_clock=lambda: 1000.0, **options)
    state.watch_router(feed.watch)
    return state, feed


def tell(router: BaseRouter, *items: object) -> None:
    for item in items:
        for observer in router.observers:
            observer(item)


def drain(subscription: Subscription) -> list[Event | Mark]:
    taken: list[Event | Mark] = []
    while (item := subscription.take()) is not None:
        taken.append(item)
        if item is Mark.CLOSED:
            break
    return taken


def test_an_event_is_one_named_sse_block_with_json_data():
    assert Event("queue", {"model": "m", "waiting": 2}).encode() == (
        b'event: queue\ndata: {"model":"m","waiting":2}\n\n'
    )


def test_a_subscriber_that_falls_behind_is_resynced_and_does_not_hold_up_the_others():
    bus = EventBus(max_pending=3)
    slow, fast = bus.subscribe(), bus.subscribe()
    for n in range(10):
        bus.publish(Event("tick", {"n": n}))
        assert fast.take() == Event("tick", {"n": n})  # keeps up
    assert slow.take() is Mark.RESYNC
    assert slow.take() is None  # everything it missed is covered by the resync snapshot
    assert slow.dropped == 10
    bus.publish(Event("tick", {"n": 10}))
    assert slow.take() == Event("tick", {"n": 10})  # caught up: gets events again


def test_closing_the_bus_ends_every_subscription():
    bus = EventBus()
    first = bus.subscribe()
    bus.publish(Event("tick", {}))
    bus.close()
    assert first.take() is Mark.CLOSED  # pending events are dropped: the server is going away
    assert bus.subscribe().take() is Mark.CLOSED
    assert bus.subscribers == 0


def test_a_closed_subscription_gets_nothing_more():
    bus = EventBus()
    subscription = bus.subscribe()
    subscription.close()
    bus.publish(Event("tick", {}))
    assert subscription.take() is Mark.CLOSED
    assert bus.subscribers == 0


def test_a_swap_is_reported_when_decided_and_when_finished_under_one_id():
    state, feed = feed_for(model("a"), model("b"))
    listener = feed.bus.subscribe()
    plan = SwapPlan("b", ("a",), "fifo.head", request_seq=7, detail="request #7 waited 0.0s")
    tell(state.router, SwapStarted(plan), SwapFinished(plan, SwapFailed("b exited"), 1.25))

    swaps = [e.data for e in drain(listener) if isinstance(e, Event) and e.name == "swap"]
    assert [s["phase"] for s in swaps] == ["started", "finished"]
    assert swaps[0]["id"] == swaps[1]["id"]
    assert swaps[0] | {"phase": None} == {
        "id": swaps[0]["id"], "phase": None, "model": "b", "evict": ["a"], "rule": "fifo.head",
        "detail": "request #7 waited 0.0s", "request_seq": 7, "started": 1000.0, "duration": None,
        "outcome": "pending", "error": None,
    }
    assert swaps[1]["outcome"] == "failed" and swaps[1]["duration"] == 1.25
    assert swaps[1]["error"] == "b exited"
    assert feed.snapshot("connect")["swaps"] == [swaps[1]]  # the history new clients get


def test_a_process_event_becomes_a_model_event_with_the_state_it_leaves_the_upstream_in():
    state, feed = feed_for(model("a"))
    listener = feed.bus.subscribe()
    tell(state.router, ProcessEvent("a", "exited", exit_code=-9, detail="killed by SIGKILL"))
    [event] = [e for e in drain(listener) if isinstance(e, Event) and e.name == "model"]
    assert event.data == {"model": "a", "state": "stopped", "event": "exited", "pid": None,
                          "detail": "killed by SIGKILL", "exit_code": -9, "duration": None, "time": 1000.0}


async def test_queue_events_are_sent_when_counts_change_and_only_then():
    slow = FakeScript(start_delay=lambda m: 30.0)  # the load outlasts the test: the request stays queued
    router = build_router(Config(models={"a": model("a")}), process_factory=fake_factory(slow))
    state = ServerState(config=router.config, router=router)
    feed = EventFeed(state)
    state.watch_router(feed.watch)
    listener = feed.bus.subscribe()
    router.start()
    try:
        feed.check_queues()
        assert drain(listener) == []  # an idle model: nothing to say
        seen: list[dict] = []

        async def queue_events() -> bool:
            seen.extend(e.data for e in drain(listener) if isinstance(e, Event) and e.name == "queue")
            return bool(seen)

        async def request() -> None:
            async with router.acquire("a"):
                pass

        task = asyncio.create_task(request())
        # The swap's notification makes the feed look at the queues right after the scheduler's turn.
        await eventually(queue_events, what="a queue event")
        assert seen == [{"model": "a", "waiting": 1, "in_flight": 0, "loading": True}]
        feed.check_queues()
        feed.check_queues()
        assert drain(listener) == []  # nothing changed since

        seen.clear()
        task.cancel()  # the client leaves
        await asyncio.gather(task, return_exceptions=True)
        await router.wait_idle()
        feed.check_queues()
        await queue_events()
        assert seen[-1]["waiting"] == 0
    finally:
        await router.shutdown(1.0)


def test_the_snapshot_describes_every_model():
    _, feed = feed_for(model("a", name="Model A", aliases=("alpha",), ttl=60), model("b", unlisted=True))
    snapshot = feed.snapshot("connect")
    assert snapshot["reason"] == "connect" and snapshot["router"] == "group"
    assert snapshot["models"][0] == {
        "id": "a", "name": "Model A", "description": "", "aliases": ["alpha"], "unlisted": False,
        "state": "stopped", "in_flight": 0, "waiting": 0, "loading": False, "pid": None,
        "last_start_seconds": None, "ttl": 60, "extras": {},
    }
    assert snapshot["models"][1]["id"] == "b" and snapshot["models"][1]["unlisted"] is True
    json.dumps(snapshot)  # what the stream sends must serialize


def test_a_reload_sends_everyone_a_fresh_snapshot_and_is_observed():
    state, feed = feed_for(model("a"))
    listener = feed.bus.subscribe()
    state.router = router_for(model("a"), model("c"))
    [event] = drain(listener)
    assert isinstance(event, Event) and event.name == "snapshot" and event.data["reason"] == "reload"
    assert [m["id"] for m in event.data["models"]] == ["a", "c"]
    tell(state.router, ProcessEvent("c", "starting"))
    assert [e.data["model"] for e in drain(listener) if isinstance(e, Event)] == ["c"]
