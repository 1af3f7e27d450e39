"""The event bus, the payloads and the feed built on router notifications (no processes, no HTTP)."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass
from unittest import mock

from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict, CIMultiDictProxy

from llmswap.activity.recorder import ActivityRecorder
from llmswap.activity.recording import RequestFacts, RequestRecord
from llmswap.config.model import Capabilities, Config, ModelConfig, PeerConfig
from llmswap.process import ProcessEvent
from llmswap.router import Router, SwapFinished, SwapStarted, build_router
from llmswap.router.types import SwapPhase
from llmswap.scheduler.errors import SwapFailed
from llmswap.scheduler.types import SwapPlan
from llmswap.server.inference.inflight import InflightTracker, redacted
from llmswap.server.observe import event_feed
from llmswap.server.observe.event_feed import EventFeed
from llmswap.server.observe.event_payloads import model_status
from llmswap.server.observe.eventbus import Event, EventBus, Mark, Subscription
from llmswap.server.state import ServerState
from tests.helpers.fake_process import FakeScript, fake_factory
from tests.helpers.wait import eventually


def client_request(method: str, path: str, headers: CIMultiDictProxy[str], peer: str,
                   app: web.Application) -> web.Request:
    """A request as aiohttp makes it for a client at `peer` (no connection behind it)."""
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (peer, 40000) if name == "peername" else default)
    return make_mocked_request(method, path, headers=headers, app=app, transport=transport)


def model(model_id: str, **fields) -> ModelConfig:
    return ModelConfig(id=model_id, cmd=("serve", model_id), proxy="http://127.0.0.1:1", **fields)


def router_for(*models: ModelConfig, **config_fields) -> Router:
    config = Config(models={m.id: m for m in models}, **config_fields)
    return build_router(config, process_factory=fake_factory(FakeScript()))


def feed_for(*models: ModelConfig, **options) -> tuple[ServerState, EventFeed]:
    router = router_for(*models)
    state = ServerState(config=router.config, router=router)
    feed = EventFeed(state, InflightTracker(), wall_clock=lambda: 1000.0, **options)
    state.watch_router(feed.watch)
    return state, feed


def tell(router: Router, *items: object) -> None:
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


def of_type(items: list[Event | Mark], kind: str) -> list:
    return [item.data for item in items if isinstance(item, Event) and item.type == kind]


def test_an_event_is_llama_swaps_envelope_with_the_payload_as_a_json_string():
    frame = Event("queue", {"model": "m", "waiting": 2}).encode()
    assert frame == b'event:message\ndata:{"type":"queue","data":"{\\"model\\":\\"m\\",\\"waiting\\":2}"}\n\n'
    envelope = json.loads(frame.decode().split("data:", 1)[1])
    assert json.loads(envelope["data"]) == {"model": "m", "waiting": 2}


def test_a_subscriber_that_falls_behind_is_resynced_and_does_not_hold_up_the_others():
    bus = EventBus(max_pending=3)
    slow, fast = bus.subscribe(), bus.subscribe()
    for n in range(10):
        bus.publish(Event("tick", {"n": n}))
        assert fast.take() == Event("tick", {"n": n})  # keeps up
        assert slow.pending <= 3
    assert slow.take() is Mark.RESYNC
    assert slow.take() is None  # everything it missed is covered by the resync
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


def test_ending_the_streams_closes_the_open_ones_and_accepts_new_ones():
    bus = EventBus()
    first = bus.subscribe()
    bus.end_streams()
    assert first.take() is Mark.CLOSED
    later = bus.subscribe()
    bus.publish(Event("tick", {}))
    assert later.take() == Event("tick", {})


def test_a_swap_is_reported_when_decided_and_when_finished_under_one_id():
    state, feed = feed_for(model("a"), model("b"))
    listener = feed.bus.subscribe()
    plan = SwapPlan("b", ("a",), "fifo.head", request_seq=7, detail="request #7 waited 0.0s")
    tell(state.router, SwapStarted(plan), SwapFinished(plan, SwapFailed("b exited"), 1.25))

    swaps = of_type(drain(listener), "swap")
    assert [s["phase"] for s in swaps] == ["started", "finished"]
    assert swaps[0]["id"] == swaps[1]["id"]
    assert swaps[0] | {"phase": None} == {
        "id": swaps[0]["id"], "phase": None, "model": "b", "evict": ["a"], "rule": "fifo.head",
        "detail": "request #7 waited 0.0s", "request_seq": 7, "started": 1000.0, "duration": None,
        "outcome": "pending", "error": None, "phases": [],
    }
    assert swaps[1]["outcome"] == "failed" and swaps[1]["duration"] == 1.25
    assert swaps[1]["error"] == "b exited"
    assert feed.snapshot("connect")["swaps"] == [swaps[1]]  # the history new clients get


def test_a_finished_swap_carries_its_phases():
    state, feed = feed_for(model("a"), model("b"))
    listener = feed.bus.subscribe()
    plan = SwapPlan("b", ("a",), "fifo.head", drain=0.5, drained=("a",))
    phases = (SwapPhase("drain", "a", 0.5), SwapPhase("stop", "a", 0.25), SwapPhase("start", "b", 2.0),
              SwapPhase("prefetch", "b", 1.0))
    tell(state.router, SwapStarted(plan), SwapFinished(plan, None, 2.25, phases))
    finished = of_type(drain(listener), "swap")[-1]
    assert finished["phases"] == [{"phase": "drain", "model": "a", "seconds": 0.5},
                                  {"phase": "stop", "model": "a", "seconds": 0.25},
                                  {"phase": "start", "model": "b", "seconds": 2.0},
                                  {"phase": "prefetch", "model": "b", "seconds": 1.0}]


def test_a_process_event_becomes_a_process_event_then_a_model_status_when_the_state_moved():
    state, feed = feed_for(model("a"), model("b"))
    feed.opening_frames()  # what a connecting client was told: everything stopped
    listener = feed.bus.subscribe()
    exited = ProcessEvent("a", "exited", exit_code=-9, detail="killed")
    tell(state.router, ProcessEvent("a", "starting"), exited)
    items = drain(listener)
    assert [i.type for i in items if isinstance(i, Event) and i.type != "queue"] == [
        "processEvent", "modelStatus", "processEvent", "modelStatus"]
    assert of_type(items, "processEvent")[1] == {
        "model": "a", "state": "stopped", "event": "exited", "pid": None, "detail": "killed", "exit_code": -9,
        "duration": None, "time": 1000.0}
    assert [{e["id"]: e["state"] for e in status} for status in of_type(items, "modelStatus")] == [
        {"a": "starting", "b": "stopped"}, {"a": "stopped", "b": "stopped"}]
    tell(state.router, ProcessEvent("a", "stopped"))  # the same state again: no modelStatus
    assert of_type(drain(listener), "modelStatus") == []


def test_model_status_lists_local_models_by_id_then_peer_models():
    caps = Capabilities(input=("text", "image"), output=("text",), context=4096)
    router = router_for(model("z", aliases=("zz",), capabilities=caps), model("a", name="A", unlisted=True),
                        peers={"far": PeerConfig("far", "http://127.0.0.1:2", ("m1",))})
    assert model_status(router.config, router) == [
        {"id": "a", "name": "A", "description": "", "state": "stopped", "unlisted": True, "peerID": ""},
        {"id": "z", "name": "", "description": "", "state": "stopped", "unlisted": False, "peerID": "",
         "aliases": ["zz"], "capabilities": {"vision": True}, "context_length": 4096},
        {"id": "far/m1", "name": "", "description": "", "state": "", "unlisted": False, "peerID": "far"},
    ]


@dataclass(frozen=True)
class Switched:
    """Stands in for the profiles module's typed event."""

    active: str


def test_a_registered_typed_event_sends_profile_changed_then_model_status(monkeypatch):
    active: list[str | None] = [None]
    state, feed = feed_for(model("a"), active_profile=lambda: active[0])
    monkeypatch.setitem(event_feed.TYPED_EVENTS, Switched, lambda feed, event: feed.profile_changed())
    assert of_type(feed.opening_frames(), "profileChanged") == [{"active": None}]
    listener = feed.bus.subscribe()
    active[0] = "coding"
    feed.publish(Switched("coding"))
    assert [(i.type, i.data) for i in drain(listener) if isinstance(i, Event)][:2] == [
        ("profileChanged", {"active": "coding"}),
        ("modelStatus", model_status(state.router.config, state.router)),
    ]


async def test_queue_events_are_sent_when_counts_change_and_only_then():
    slow = FakeScript(start_delay=lambda m: 30.0)  # the load outlasts the test: the request stays queued
    router = build_router(Config(models={"a": model("a")}), process_factory=fake_factory(slow))
    state = ServerState(config=router.config, router=router)
    feed = EventFeed(state, InflightTracker())
    state.watch_router(feed.watch)
    listener = feed.bus.subscribe()
    router.start()
    try:
        feed.check_queues()
        assert drain(listener) == []  # an idle model: nothing to say
        seen: list[dict] = []

        async def queue_events() -> bool:
            seen.extend(of_type(drain(listener), "queue"))
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
        assert of_type(drain(listener), "queue") == []  # nothing changed since

        seen.clear()
        task.cancel()  # the client leaves
        await asyncio.gather(task, return_exceptions=True)
        await router.wait_idle()
        feed.check_queues()
        await queue_events()
        assert seen[-1]["waiting"] == 0
    finally:
        await router.shutdown(1.0)


def test_the_snapshot_describes_every_model_with_its_counts():
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


def test_a_reload_ends_the_open_streams_and_the_new_router_is_observed():
    state, feed = feed_for(model("a"))
    listener = feed.bus.subscribe()
    replacement = router_for(model("a"), model("c"))
    state.install(replacement, replacement.config)
    assert drain(listener) == [Mark.CLOSED]
    later = feed.bus.subscribe()
    tell(state.router, ProcessEvent("c", "starting"))
    assert [e["model"] for e in of_type(drain(later), "processEvent")] == ["c"]


def test_log_lines_become_log_data_frames():
    state, feed = feed_for(model("a"))
    listener = feed.bus.subscribe()
    state.proxy_log.append("proxy says")
    state.upstream_log.append("[a] upstream says")
    assert of_type(drain(listener), "logData") == [
        {"source": "proxy", "data": "proxy says\n"}, {"source": "upstream", "data": "[a] upstream says\n"}]


def test_credentials_are_redacted_in_shown_headers_and_only_the_first_value_is_kept():
    headers = CIMultiDict([("Authorization", "Bearer x"), ("x-api-key", "k"), ("Cookie", "c"),
                           ("Accept", "a/b"), ("Accept", "c/d")])
    assert redacted(headers) == {"Authorization": "[REDACTED]", "x-api-key": "[REDACTED]",
                                 "Cookie": "[REDACTED]", "Accept": "a/b"}


async def test_a_line_logged_from_a_worker_thread_is_published_on_the_loop():
    state, feed = feed_for(model("a"))
    listener = feed.subscribe()
    publishing_threads: list[int] = []
    publish = feed.bus.publish

    def recording(event: Event) -> None:
        publishing_threads.append(threading.get_ident())
        publish(event)

    feed.bus.publish = recording  # type: ignore[method-assign]
    await asyncio.to_thread(state.proxy_log.append, "from a thread")
    item = await listener.next(timeout=5.0)
    assert item == Event("logData", {"source": "proxy", "data": "from a thread\n"})
    assert publishing_threads == [threading.get_ident()]  # the loop's thread, not the worker's
    await feed.close()


def test_the_bus_says_when_its_first_subscriber_joins_and_when_its_last_leaves():
    told: list[bool] = []
    bus = EventBus(on_listening=told.append)
    first, second = bus.subscribe(), bus.subscribe()
    first.close()
    first.close()  # a second close changes nothing
    assert (told, bus.subscribers) == ([True], 1)
    second.close()
    third = bus.subscribe()
    bus.close()
    assert (told, bus.subscribers, third.closed) == ([True, False, True, False], 0, True)
    bus.subscribe()  # a closed bus takes no subscriber: nobody starts listening
    assert told == [True, False, True, False]


def test_streams_opened_one_after_another_each_get_every_log_line_once():
    state, feed = feed_for(model("a"))
    state.proxy_log.append("while nobody listens")
    first = feed.bus.subscribe()
    state.proxy_log.append("to the first")
    assert of_type(drain(first), "logData") == [{"source": "proxy", "data": "to the first\n"}]
    first.close()
    state.proxy_log.append("between the two")
    second = feed.bus.subscribe()
    state.proxy_log.append("to the second")
    assert of_type(drain(second), "logData") == [{"source": "proxy", "data": "to the second\n"}]


def test_stored_activity_rows_are_announced_only_while_a_stream_is_open():
    recorder = ActivityRecorder()
    _, feed = feed_for(model("a"), recorder=recorder)

    def row(path: str) -> int:
        recording = recorder.begin(RequestFacts("a", path))
        recording.response_headers(200, {"Content-Type": "application/json"})
        record = recording.finish()
        assert record is not None
        return record.id

    row("/v1/before")
    assert feed.on_activity not in recorder.listeners  # nobody listens: a stored row costs the feed nothing
    stream = feed.bus.subscribe()
    seen = row("/v1/while")
    assert of_type(drain(stream), "activity") == [{"id": seen}]
    stream.close()
    row("/v1/after")
    assert feed.on_activity not in recorder.listeners


async def test_a_stream_gets_progress_of_a_request_begun_before_it_opened_only_once_bytes_move():
    _, feed = feed_for(model("a"))
    app = web.Application()
    headers = CIMultiDictProxy(CIMultiDict({"X-Real-IP": "203.0.113.7"}))
    request = client_request("POST", "/v1/chat/completions", headers, "127.0.0.1", app)
    record = RequestRecord()
    entry = feed.inflight.open(request, record, "a")
    record.relayed(100)
    listener = feed.subscribe()
    assert [r["resp_bytes"] for r in feed.inflight_snapshot()["requests"]] == [100]
    feed.check_progress()
    assert drain(listener) == []  # the opening snapshot said 100 already
    record.relayed(50)
    feed.check_progress()
    feed.inflight.close(entry)
    upsert, remove = of_type(drain(listener), "inflight")
    assert (upsert["operation"], upsert["request"]["resp_bytes"], upsert["request"]["remote_ip"]) == (
        "upsert", 150, "203.0.113.7")
    assert remove == {"operation": "remove", "id": entry.id}
    listener.close()
    later = feed.inflight.open(request, RequestRecord(), "a")
    feed.inflight.close(later)
    assert drain(feed.subscribe()) == []  # what happened while nobody listened is not replayed
    await feed.close()


def test_a_closed_inflight_entry_still_shows_the_client_address_it_had():
    app = web.Application()
    tracker = InflightTracker()
    for headers, expected in (({"X-Forwarded-For": "198.51.100.1, 10.0.0.1"}, "198.51.100.1"),
                              ({"X-Real-IP": " 203.0.113.7 "}, "203.0.113.7"), ({}, "192.0.2.5")):
        request = client_request("POST", "/v1/embeddings", CIMultiDictProxy(CIMultiDict(headers)),
                                 "192.0.2.5", app)
        entry = tracker.open(request, RequestRecord(), "a", task=object())  # type: ignore[arg-type]
        shown_open = entry.as_dict(0.0)["remote_ip"]
        tracker.close(entry)
        assert (shown_open, entry.as_dict(0.0)["remote_ip"], entry.request) == (expected, expected, None)


def test_an_event_with_undecodable_request_text_still_encodes() -> None:
    """A header of invalid UTF-8 (aiohttp decodes it with surrogateescape) echoed in a log line must not
    end the /api/events stream with a UnicodeEncodeError (found by test_fuzz_requests)."""
    line = "guard: refused POST / from the origin '\udc93\udc89A'"
    frame = Event("logData", {"source": "proxy", "data": line}).encode()
    payload = json.loads(json.loads(frame.decode().split("data:", 1)[1])["data"])
    assert payload["data"] == "guard: refused POST / from the origin '??A'"
