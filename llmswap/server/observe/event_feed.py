"""The app's event source for `/api/events`: turns what the router, the logs and the in-flight tracker
report into envelopes on one `EventBus`, and builds the frames a stream opens with.

Sources (each typed; nothing here reads log text):
- router observers (`watch`, on every router a config reload installs): `SwapStarted`/`SwapFinished` →
  `swap`; process events → `processEvent`, then `modelStatus` when a model's state changed;
- the proxy and upstream `LogRing`s → `logData`, one frame per line;
- the `InflightTracker` → `inflight` upsert/remove; byte progress at most once per `poll` per request;
- the `ActivityRecorder`'s stored rows → `activity {id}`;
- the log rings, the tracker and the recorder are listened to only while a stream is open: nobody
  listening, no work;
- the scheduler's queue counts, looked at right after each router event and every `poll` seconds while
  anyone listens → `queue`;
- `publish(item)` for typed events from other modules, mapped by `TYPED_EVENTS`.

A config reload ends every open stream (as llama-swap's do); clients reconnect and get the new state.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from llmswap.activity.record import ActivityRecord
from llmswap.activity.recorder import ActivityRecorder
from llmswap.process.events import ProcessEvent
from llmswap.process.logring import LogRing
from llmswap.router.router import Router, SwapFinished, SwapStarted
from llmswap.router.types import RouterEvent
from llmswap.server.inference.inflight import InflightEntry, InflightTracker
from llmswap.server.observe import event_payloads as payloads
from llmswap.server.observe.event_payloads import QueueCounts, SwapRecord
from llmswap.server.observe.eventbus import MAX_PENDING, Event, EventBus, Subscription
from llmswap.server.state import ServerState

KEEPALIVE_INTERVAL = 15.0  # seconds of silence before a keep-alive comment
POLL_INTERVAL = 0.25  # seconds between looks at queue counts and in-flight byte counts while anyone listens
RECENT_SWAPS = 50  # swaps a snapshot carries
LOG_SOURCES = ("proxy", "upstream")

# Typed events other modules publish (`EventFeed.publish`, or as router observers), by type: what each
# becomes on the stream. A profile switch registers as `TYPED_EVENTS[ProfileChanged] = lambda feed, event:
# feed.profile_changed()` (profileChanged, then modelStatus), with the feed's `active_profile` reading the
# same state.
TYPED_EVENTS: dict[type, Callable[[EventFeed, Any], None]] = {}


class EventFeed:
    """Router observers, swap history, queue and in-flight watching, log lines, opening frames, the bus."""

    def __init__(
        self,
        server_state: ServerState,
        inflight: InflightTracker,
        *,
        recorder: ActivityRecorder | None = None,
        max_pending: int = MAX_PENDING,
        keepalive: float = KEEPALIVE_INTERVAL,
        poll: float = POLL_INTERVAL,
        recent_swaps: int = RECENT_SWAPS,
        wall_clock: Callable[[], float] = time.time,
        active_profile: Callable[[], str | None] = payloads.no_profile,
    ) -> None:
        self.server_state = server_state
        self.keepalive = keepalive
        self.poll = poll
        self.wall_clock = wall_clock
        self.active_profile = active_profile
        self.bus = EventBus(max_pending, on_listening=self._listening)
        self._swaps: deque[SwapRecord] = deque(maxlen=recent_swaps)
        self._open: dict[int, SwapRecord] = {}  # id(plan) -> record, while the swap runs
        self._swap_ids = itertools.count(1)
        self._published: dict[str, QueueCounts] = {}  # what the last queue events said, per model
        self._loading_sent: dict[str, int] = {}  # per model loading: the mark its last `loading` event had
        self._status: list[dict[str, Any]] | None = None  # the last modelStatus sent
        self._sent_bytes: dict[str, int] = {}  # in-flight id -> resp_bytes last published
        self._check_pending = False
        self._poller: asyncio.Task[None] | None = None
        self._routers = 0
        # Each followed ring and the listener that turns its lines into `logData` (attached while anyone
        # listens).
        self._rings: dict[int, tuple[LogRing, Callable[[str], None]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the streams' loop, once one subscribed
        self.inflight = inflight
        self.recorder = recorder
        self._follow_log(server_state.proxy_log, "proxy")

    # ------------------------------------------------------------------ routers

    def watch(self, router: Router) -> None:
        """Observe `router`; every router after the first came with a reload: open streams end."""
        # A successor router may have inherited the observer from its predecessor (handover).
        if self.on_router_event not in router.observers:
            router.add_observer(self.on_router_event)
        self._follow_log(router.upstream_log, "upstream")
        self._routers += 1
        if self._routers > 1:
            self._status = None
            self.bus.end_streams()

    def on_router_event(self, item: RouterEvent) -> None:
        if isinstance(item, SwapStarted):
            record = SwapRecord(next(self._swap_ids), item.plan, self.wall_clock())
            self._open[id(item.plan)] = record
            self._swaps.append(record)
            self.bus.publish(Event("swap", record.as_dict("started")))
        elif isinstance(item, SwapFinished):
            opened = self._open.pop(id(item.plan), None)
            if opened is not None:
                record = opened
            else:  # started before this feed watched the router
                record = SwapRecord(next(self._swap_ids), item.plan, self.wall_clock() - item.duration)
                self._swaps.append(record)
            record.finished = True
            record.duration = item.duration
            record.error = None if item.error is None else item.error.message
            record.phases = item.phases
            self.bus.publish(Event("swap", record.as_dict("finished")))
        elif isinstance(item, ProcessEvent) and item.kv is not None:
            self.bus.publish(Event("kvcache", payloads.kv_event(item.model, item.kv, self.wall_clock())))
        elif isinstance(item, ProcessEvent):
            process = self.server_state.router.processes.get(item.model)
            pid = process.pid if process is not None else None
            self.bus.publish(Event("processEvent", payloads.process_event(item, pid, self.wall_clock())))
            self.publish_model_status({item.model: payloads.STATE_AFTER[item.kind]})
        self._check_soon()

    def publish(self, item: object) -> None:
        """Publish a typed event from another module (see `TYPED_EVENTS`); an `Event` goes out as it is."""
        if isinstance(item, Event):
            self.bus.publish(item)
        elif type(item) in TYPED_EVENTS:
            TYPED_EVENTS[type(item)](self, item)
            self._check_soon()
        else:
            raise TypeError(f"no stream type for {type(item).__name__}: register it in TYPED_EVENTS")

    def model_status(self, overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        router = self.server_state.router
        return payloads.model_status(router.config, router, overrides)

    def publish_model_status(self, overrides: dict[str, Any] | None = None) -> None:
        """`modelStatus`, when it differs from the last one sent."""
        status = self.model_status(overrides)
        if status != self._status:
            self._status = status
            self.bus.publish(Event("modelStatus", status))

    def profile_changed(self) -> None:
        """The active profile changed: `profileChanged`, then `modelStatus` (as llama-swap sends them)."""
        self.bus.publish(Event("profileChanged", payloads.profile_changed(self.active_profile())))
        self._status = None
        self.publish_model_status()

    # ------------------------------------------------------------------ logs and in-flight requests

    def _listening(self, anyone: bool) -> None:
        # Told by the bus when its first subscriber joins and its last leaves. The log rings, the in-flight
        # tracker and the recorder call the feed only in between: with nobody listening (the common case) a
        # request costs the feed nothing.
        listeners = self.inflight.listeners
        rows = self.recorder.listeners if self.recorder is not None else []
        if anyone:
            # What a new stream's opening frames show: progress is published from there on.
            self._sent_bytes = {entry.id: entry.resp_bytes for entry in self.inflight.entries()}
            if self.on_inflight not in listeners:
                listeners.append(self.on_inflight)
            if self.on_activity not in rows:
                rows.append(self.on_activity)
            for ring, on_line in self._rings.values():
                if on_line not in ring.listeners:
                    ring.listeners.append(on_line)
        else:
            self._sent_bytes = {}
            if self.on_inflight in listeners:
                listeners.remove(self.on_inflight)
            if self.on_activity in rows:
                rows.remove(self.on_activity)
            for ring, on_line in self._rings.values():
                if on_line in ring.listeners:
                    ring.listeners.remove(on_line)

    def on_activity(self, record: ActivityRecord) -> None:
        """A row was stored: `activity {id}` (the status page then reads the row)."""
        self.bus.publish(Event("activity", {"id": record.id}))

    def _follow_log(self, ring: LogRing, source: str) -> None:
        if id(ring) in self._rings:
            return

        def on_line(line: str) -> None:
            if not self.bus.subscribers:
                return
            event = Event("logData", {"source": source, "data": line + "\n"})
            loop = self._loop
            if loop is not None and not _on_loop(loop):
                if loop.is_closed():
                    return
                # A record logged from a worker thread (the task queue's SQLite calls): the bus and its
                # subscribers belong to the loop.
                loop.call_soon_threadsafe(self.bus.publish, event)
            else:
                self.bus.publish(event)

        self._rings[id(ring)] = (ring, on_line)
        if self.bus.subscribers:
            ring.listeners.append(on_line)

    def on_inflight(self, operation: str, entry: InflightEntry) -> None:
        if operation == "remove":
            self._sent_bytes.pop(entry.id, None)
            if self.bus.subscribers:
                self.bus.publish(Event("inflight", {"operation": "remove", "id": entry.id}))
            return
        self._sent_bytes[entry.id] = entry.resp_bytes
        if not self.bus.subscribers:
            return  # nobody to tell: the entry dict is built only for listeners
        self.bus.publish(Event("inflight", {"operation": "upsert",
                                            "request": entry.as_dict(self.inflight.monotonic())}))
        self._check_soon()

    def inflight_snapshot(self) -> dict[str, Any]:
        """`inflight` snapshot; with no request in flight it has no `requests` key, as llama-swap's."""
        now = self.inflight.monotonic()
        entries = sorted(self.inflight.entries(), key=lambda entry: (entry.started, int(entry.id)))
        if not entries:
            return {"operation": "snapshot"}
        return {"operation": "snapshot", "requests": [entry.as_dict(now) for entry in entries]}

    def check_progress(self) -> None:
        """An `inflight` upsert for each request whose byte count moved since it was last published."""
        for entry in self.inflight.entries():
            if self._sent_bytes.get(entry.id) != entry.resp_bytes:
                self.on_inflight("upsert", entry)

    # ------------------------------------------------------------------ queue counts

    def _check_soon(self) -> None:
        # Many router events arrive in one loop iteration (a burst of requests): one look covers them.
        if self._check_pending or not self.bus.subscribers:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.check_queues()
            return
        self._check_pending = True
        loop.call_soon(self.check_queues)

    def check_queues(self) -> None:
        """A `queue` event for each model whose counts differ from what was last published."""
        self._check_pending = False
        router = self.server_state.router
        snapshot = router.snapshot()
        for model in sorted(router.processes):
            counts = QueueCounts(snapshot.waiting.get(model, 0), snapshot.in_flight.get(model, 0),
                                 model in snapshot.loading)
            if self._published.get(model, QueueCounts()) != counts:
                self._published[model] = counts
                self.bus.publish(Event("queue", counts.as_dict(model)))

    def check_loading(self) -> None:
        """A `loading` event per model whose load is under way, when its estimate moved (a whole percent,
        or a tenth of a second when its load time is not known yet)."""
        router = self.server_state.router
        loading = router.snapshot().loading
        for model in sorted(loading):
            progress = router.load_progress(model)
            if progress is None:
                continue
            fraction = progress.fraction
            mark = round(fraction * 100) if fraction is not None else -round(progress.elapsed * 10)
            if self._loading_sent.get(model) != mark:
                self._loading_sent[model] = mark
                self.bus.publish(Event("loading", progress.as_dict()))
        for model in [m for m in self._loading_sent if m not in loading]:
            del self._loading_sent[model]

    async def _watch_counts(self) -> None:
        # Requests joining a queue or relaying bytes have no notification of their own: look often, but
        # only while someone listens.
        try:
            while self.bus.subscribers:
                self.check_queues()
                self.check_progress()
                self.check_loading()
                await asyncio.sleep(self.poll)
        finally:
            self._poller = None

    # ------------------------------------------------------------------ subscribers

    def subscribe(self) -> Subscription:
        self._loop = asyncio.get_running_loop()
        subscription = self.bus.subscribe()
        if self._poller is None and not self.bus.closed:
            self._poller = asyncio.get_running_loop().create_task(self._watch_counts(), name="events-counts")
        return subscription

    def snapshot(self, reason: str) -> dict[str, Any]:
        """llmswap's `snapshot`: models with counts and footprints, the router's facts, recent swaps."""
        server = self.server_state
        router = server.router
        swaps = [record.as_dict("finished" if record.finished else "started") for record in self._swaps]
        return payloads.snapshot(router, reason=reason, now=self.wall_clock(),
                                 started_at=server.started_at, swaps=swaps)

    def opening_frames(self) -> list[Event]:
        """What a new stream gets first, in llama-swap's order, then llmswap's snapshot."""
        server = self.server_state
        frames = [Event("logData", {"source": source, "data": _history(ring)})
                  for source, ring in zip(LOG_SOURCES, (server.proxy_log, server.upstream_log), strict=True)]
        self._status = self.model_status()
        return [
            *frames,
            Event("modelStatus", self._status),
            Event("uiConfig", payloads.ui_config(server.config)),
            Event("profileChanged", payloads.profile_changed(self.active_profile())),
            Event("inflight", self.inflight_snapshot()),
            Event("snapshot", self.snapshot("connect")),
        ]

    def resync_frames(self) -> list[Event]:
        """The state again, for a stream whose frames were dropped: it replaces all the stream knew."""
        return [
            Event("modelStatus", self.model_status()),
            Event("profileChanged", payloads.profile_changed(self.active_profile())),
            Event("inflight", self.inflight_snapshot()),
            Event("snapshot", self.snapshot("resync")),
        ]

    async def close(self) -> None:
        self.bus.close()
        poller = self._poller
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _history(ring: LogRing) -> str:
    return "".join(f"{line}\n" for line in ring.history())
