"""`GET /api/events`: a server-sent event stream of what the router does, for UIs and scripts.

A client needs nothing else: the stream opens with a `snapshot` of every model, then follows changes.
Every event is `event: <name>` plus one `data:` line of JSON; a comment line (`: keepalive`) is sent
every ~15 s while nothing else is. The stream ends when the client leaves or the server shuts down.

Events (all times are wall-clock seconds since the epoch, durations seconds):

`snapshot`  on connect, and again after a config reload (`reason: "reload"`)::

    {"reason": "connect", "time": 1718000000.0, "router": "group", "version": "0.1.0",
     "started_at": 1717990000.0,
     "models": [{"id": "qwen", "name": "", "description": "", "aliases": ["q"], "unlisted": false,
                 "state": "ready", "in_flight": 1, "waiting": 0, "loading": false, "pid": 4242,
                 "last_start_seconds": 2.4, "ttl": 300,
                 "extras": {"vram": {"footprint": 5368709120, "footprint_human": "5.0 GiB", ...}}}],
     "router_extras": {}, "swaps": [<swap objects, oldest first>]}

`resync`    the same shape, `reason: "resync"`: this client fell behind and events were dropped for it;
            the snapshot replaces everything it knew.

`model`     a model's upstream changed state::

    {"model": "qwen", "state": "ready", "event": "ready", "pid": 4242, "detail": "", "exit_code": null,
     "duration": 2.4, "time": ...}

    `event` is the process event: starting, ready, start_failed, stopping, stopped, exited (unexpected),
    ttl_expired; `state` is the upstream's state after it: stopped, starting, ready or stopping.

`queue`     a model's waiting or in-flight count changed (bursts coalesce into one event)::

    {"model": "qwen", "waiting": 3, "in_flight": 1, "loading": true}

`swap`      a swap decision (`phase: "started"`) and, under the same `id`, its end (`phase: "finished"`)::

    {"id": 7, "phase": "started", "model": "qwen", "evict": ["llama"], "rule": "fifo.head",
     "detail": "...", "request_seq": 41, "started": ..., "duration": null, "outcome": "pending",
     "error": null}
    {"id": 7, "phase": "finished", ..., "duration": 3.1, "outcome": "ok" | "failed", "error": "..."}

One `EventBus` per app fans events out: publishing never blocks, each subscriber has a bounded backlog,
and a subscriber that falls behind has its backlog dropped and is sent a `resync` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from llmswap import __version__
from llmswap.process.state import ProcessState
from llmswap.router.base import BaseRouter, SwapFinished, SwapStarted
from llmswap.scheduler.types import SwapPlan
from llmswap.server.state import STATE, ServerState

if TYPE_CHECKING:
    from llmswap.server.profiles import ProfileChanged

log = logging.getLogger("llmswap.events")

EVENTS_KEY = "events"  # ServerState.extras key of the app's EventFeed
MAX_PENDING = 256  # events a subscriber may fall behind before it is resynced
KEEPALIVE_INTERVAL = 15.0  # seconds of silence before a keep-alive comment
QUEUE_POLL_INTERVAL = 0.25  # seconds between looks at the queue depths while anyone listens
CLIENT_CHECK_INTERVAL = 0.5  # how often a quiet stream checks that its client is still there
RECENT_SWAPS = 50  # swaps a snapshot carries


# The state a process is in once it has reported each event (see llmswap.process.process). Read from the
# event rather than from a router: after a config reload the router that hears it may not own the process.
STATE_AFTER: Mapping[str, ProcessState] = {
    "starting": ProcessState.STARTING,
    "ready": ProcessState.READY,
    "start_failed": ProcessState.STOPPED,
    "stopping": ProcessState.STOPPING,
    "stopped": ProcessState.STOPPED,
    "exited": ProcessState.STOPPED,
    "ttl_expired": ProcessState.READY,  # its stop follows at once
}


@dataclass(frozen=True)
class Event:
    name: str
    data: Mapping[str, Any]

    def encode(self) -> bytes:
        payload = json.dumps(self.data, separators=(",", ":"), default=str)
        return f"event: {self.name}\ndata: {payload}\n\n".encode()


KEEPALIVE = b": keepalive\n\n"


class Mark(enum.Enum):
    """What a subscription yields besides events."""

    RESYNC = "resync"  # events were dropped: send a fresh snapshot
    CLOSED = "closed"  # the bus closed (server shutdown) or the subscription was closed


class Subscription:
    """One subscriber's bounded backlog. Delivery is synchronous and never waits for the reader."""

    def __init__(self, bus: EventBus, max_pending: int) -> None:
        self._bus = bus
        self._pending: deque[Event] = deque()
        self._max_pending = max(1, max_pending)
        self._behind = False  # backlog dropped; nothing more is queued until the reader takes the resync
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None
        self.dropped = 0  # events this subscriber never got (the resync snapshot stood in for them)

    def _deliver(self, event: Event) -> None:
        if self._closed:
            return
        if self._behind:
            self.dropped += 1
            return
        if len(self._pending) >= self._max_pending:
            self.dropped += len(self._pending) + 1
            self._pending.clear()
            self._behind = True
        else:
            self._pending.append(event)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def take(self) -> Event | Mark | None:
        """The next event or mark, or None when there is nothing yet."""
        if self._behind:
            self._behind = False
            return Mark.RESYNC
        if self._pending:
            return self._pending.popleft()
        if self._closed:
            return Mark.CLOSED
        return None

    async def next(self, timeout: float | None = None) -> Event | Mark | None:
        """The next event or mark, waiting up to `timeout` seconds for one (None when none came)."""
        item = self.take()
        if item is not None:
            return item
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        finally:
            self._waiter = None
            waiter.cancel()
        return self.take()

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def behind(self) -> bool:
        """Whether this subscriber fell behind and has not yet taken its resync."""
        return self._behind

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pending.clear()
            self._behind = False
            self._bus._unsubscribe(self)
            self._wake()


class EventBus:
    """Fans events out to every subscriber; publishing is synchronous (call it on the loop thread)."""

    def __init__(self, max_pending: int = MAX_PENDING) -> None:
        self.max_pending = max_pending
        self._subscribers: dict[Subscription, None] = {}  # in subscription order
        self._closed = False

    def subscribe(self) -> Subscription:
        subscription = Subscription(self, self.max_pending)
        if self._closed:
            subscription.close()
        else:
            self._subscribers[subscription] = None
        return subscription

    def _unsubscribe(self, subscription: Subscription) -> None:
        self._subscribers.pop(subscription, None)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    @property
    def subscriptions(self) -> tuple[Subscription, ...]:
        """The open subscriptions, oldest first."""
        return tuple(self._subscribers)

    @property
    def closed(self) -> bool:
        return self._closed

    def publish(self, event: Event) -> None:
        for subscription in tuple(self._subscribers):
            subscription._deliver(event)

    def close(self) -> None:
        """End every subscription (server shutdown); later subscriptions start closed."""
        self._closed = True
        for subscription in tuple(self._subscribers):
            subscription.close()


# ---------------------------------------------------------------------------------------------- the feed


@dataclass
class SwapRecord:
    """One swap as the events and the snapshot's history show it."""

    id: int
    plan: SwapPlan
    started: float
    duration: float | None = None
    error: str | None = None
    finished: bool = False

    def as_dict(self, phase: str) -> dict[str, Any]:
        outcome = "pending" if not self.finished else ("ok" if self.error is None else "failed")
        return {
            "id": self.id, "phase": phase, "model": self.plan.model, "evict": list(self.plan.evict),
            "rule": self.plan.rule, "detail": self.plan.detail, "request_seq": self.plan.request_seq,
            "started": self.started, "duration": self.duration, "outcome": outcome, "error": self.error,
        }


@dataclass(frozen=True)
class QueueCounts:
    waiting: int = 0
    in_flight: int = 0
    loading: bool = False


class EventFeed:
    """The app's event source: router observers, swap history, queue watching, snapshots, the bus."""

    def __init__(
        self,
        server_state: ServerState,
        *,
        max_pending: int = MAX_PENDING,
        keepalive: float = KEEPALIVE_INTERVAL,
        queue_poll: float = QUEUE_POLL_INTERVAL,
        recent_swaps: int = RECENT_SWAPS,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.server_state = server_state
        self.keepalive = keepalive
        self.queue_poll = queue_poll
        self.wall_clock = wall_clock
        self.bus = EventBus(max_pending)
        self._swaps: deque[SwapRecord] = deque(maxlen=recent_swaps)
        self._open: dict[int, SwapRecord] = {}  # id(plan) -> record, while the swap runs
        self._swap_ids = itertools.count(1)
        self._published: dict[str, QueueCounts] = {}  # what the last queue events said, per model
        self._check_pending = False
        self._poller: asyncio.Task[None] | None = None
        self._routers = 0

    # ------------------------------------------------------------------ routers

    def watch(self, router: BaseRouter) -> None:
        """Observe `router`; every router after the first came with a reload: everyone gets a snapshot."""
        # A successor router may have inherited the observer from its predecessor (handover).
        if self.on_router_event not in router.observers:
            router.add_observer(self.on_router_event)
        self._routers += 1
        if self._routers > 1:
            self.bus.publish(Event("snapshot", self.snapshot("reload")))

    def on_router_event(self, item: object) -> None:
        if isinstance(item, SwapStarted):
            record = SwapRecord(next(self._swap_ids), item.plan, self.wall_clock())
            self._open[id(item.plan)] = record
            self._swaps.append(record)
            self.bus.publish(Event("swap", record.as_dict("started")))
        elif isinstance(item, SwapFinished):
            record = self._open.pop(id(item.plan), None)
            if record is None:  # started before this feed watched the router
                record = SwapRecord(next(self._swap_ids), item.plan, self.wall_clock() - item.duration)
                self._swaps.append(record)
            record.finished = True
            record.duration = item.duration
            record.error = None if item.error is None else item.error.message
            self.bus.publish(Event("swap", record.as_dict("finished")))
        else:
            # Process events (ProcessEvent, or a test double with the same fields): read by their fields.
            model, kind = getattr(item, "model", None), getattr(item, "kind", None)
            if isinstance(model, str) and isinstance(kind, str) and kind in STATE_AFTER:
                process = self.server_state.router.processes.get(model)
                self.bus.publish(Event("model", {
                    "model": model, "state": STATE_AFTER[kind].value, "event": kind,
                    "pid": process.pid if process is not None else None,
                    "detail": getattr(item, "detail", ""), "exit_code": getattr(item, "exit_code", None),
                    "duration": getattr(item, "duration", None), "time": self.wall_clock(),
                }))
        self._check_soon()

    def on_profile_changed(self, change: ProfileChanged) -> None:
        """The active profile changed (`llmswap.server.profiles`): `profile` {"active": name or null}."""
        self.bus.publish(Event("profile", {"active": change.active}))

    # ------------------------------------------------------------------ queue depths

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
        """Publish a `queue` event for each model whose counts differ from what was last published."""
        self._check_pending = False
        router = self.server_state.router
        snapshot = router.snapshot()
        for model in sorted(router.processes):
            counts = QueueCounts(snapshot.waiting.get(model, 0), snapshot.in_flight.get(model, 0),
                                 model in snapshot.loading)
            if self._published.get(model, QueueCounts()) != counts:
                self._published[model] = counts
                self.bus.publish(Event("queue", {"model": model, "waiting": counts.waiting,
                                                 "in_flight": counts.in_flight, "loading": counts.loading}))

    async def _poll_queues(self) -> None:
        # Requests joining a queue or finishing have no router notification of their own: look often,
        # but only while someone listens.
        try:
            while self.bus.subscribers:
                self.check_queues()
                await asyncio.sleep(self.queue_poll)
        finally:
            self._poller = None

    # ------------------------------------------------------------------ subscribers

    def subscribe(self) -> Subscription:
        subscription = self.bus.subscribe()
        if self._poller is None and not self.bus.closed:
            self._poller = asyncio.get_running_loop().create_task(self._poll_queues(), name="events-queue")
        return subscription

    def snapshot(self, reason: str) -> dict[str, Any]:
        """Everything a client needs to draw the current state (the `snapshot` / `resync` event)."""
        server = self.server_state
        router = server.router
        counts = router.snapshot()
        models = []
        for model_id in sorted(router.processes):
            process = router.processes[model_id]
            config = process.config
            visible = router.model_state(model_id)
            last_start = process.last_start_duration
            models.append({
                "id": model_id, "name": config.name, "description": config.description,
                "aliases": list(config.aliases), "unlisted": config.unlisted,
                "state": visible.value if visible is not None else None,
                "in_flight": counts.in_flight.get(model_id, 0), "waiting": counts.waiting.get(model_id, 0),
                "loading": model_id in counts.loading, "pid": process.pid,
                "last_start_seconds": round(last_start, 3) if last_start is not None else None,
                "ttl": config.ttl, "extras": router.model_extras(model_id),
            })
        return {
            "reason": reason, "time": self.wall_clock(), "router": router.name, "version": __version__,
            "started_at": server.started_at, "models": models, "router_extras": router.router_extras(),
            "swaps": [record.as_dict("finished" if record.finished else "started") for record in self._swaps],
        }

    async def close(self) -> None:
        self.bus.close()
        poller = self._poller
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller


def feed_of(server_state: ServerState) -> EventFeed:
    """The app's feed, created on first use (a test may put its own in `extras` first)."""
    return server_state.extra(EVENTS_KEY, EventFeed, lambda: EventFeed(server_state))


# ---------------------------------------------------------------------------------------------- the route


def setup(app: web.Application) -> None:
    feed = feed_of(app[STATE])
    app[STATE].watch_router(feed.watch)
    app.router.add_get("/api/events", stream)
    app.on_shutdown.append(_end_streams)


async def _end_streams(app: web.Application) -> None:
    await feed_of(app[STATE]).close()


async def stream(request: web.Request) -> web.StreamResponse:
    feed = feed_of(request.app[STATE])
    subscription = feed.subscribe()
    try:
        # No await between subscribing and taking the snapshot: nothing falls between the two.
        first = Event("snapshot", feed.snapshot("connect"))
        response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",  # a buffering reverse proxy in front would hold events back
        })
        await response.prepare(request)
        try:
            await response.write(first.encode())
            await _follow(request, response, feed, subscription)
            await response.write_eof()
        except ConnectionError:
            log.debug("event stream: the client left")
        return response
    finally:
        subscription.close()


async def _follow(
    request: web.Request, response: web.StreamResponse, feed: EventFeed, subscription: Subscription
) -> None:
    loop = asyncio.get_running_loop()
    last_write = loop.time()
    while True:
        item = await subscription.next(timeout=min(CLIENT_CHECK_INTERVAL, feed.keepalive))
        if item is Mark.CLOSED:
            return
        if item is Mark.RESYNC:
            await response.write(Event("resync", feed.snapshot("resync")).encode())
        elif isinstance(item, Event):
            await response.write(item.encode())
        else:
            # aiohttp does not cancel a handler whose client left: look, rather than wait for an event.
            transport = request.transport
            if transport is None or transport.is_closing():
                return
            if loop.time() - last_write < feed.keepalive:
                continue
            await response.write(KEEPALIVE)
        last_write = loop.time()
