"""What the server is made of: `Services`, built once by `build_services` in dependency order.

Each part is handed to whoever needs it: the route groups read it from the application under its own typed
key (`services.install`), and the parts that use one another get it in their constructor. Nothing is made
on first use, nothing is looked up by name: a reader learns the whole server from `build_services`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from llmswap.activity.recorder import ActivityRecorder
from llmswap.machine import MemoryReader
from llmswap.server.admin.tasks import TASKS, Tasks
from llmswap.server.inference.inflight import INFLIGHT, InflightTracker
from llmswap.server.inference.peer_watch import PEER_WATCH, PeerWatch
from llmswap.server.inference.profiles import PROFILES, Profiles
from llmswap.server.inference.proxy import DISPATCHER, UPSTREAMS
from llmswap.server.inference.selectors import SELECTORS, Selectors
from llmswap.server.inference.websocket import SOCKETS, OpenSockets
from llmswap.server.observe.activity import RECORDER, settings_of
from llmswap.server.observe.event_feed import EventFeed
from llmswap.server.observe.events import FEED
from llmswap.server.observe.metrics import METRICS, ServerMetrics
from llmswap.server.observe.performance import PERFORMANCE, Performance
from llmswap.server.state import ServerState
from llmswap.upstream import Dispatcher, UpstreamPool


@dataclass(frozen=True)
class Services:
    """The parts every route group and the lifecycle use, for one server."""

    pool: UpstreamPool  # keep-alive connections to every upstream
    dispatcher: Dispatcher  # the one path to a local model: lease, send, release
    recorder: ActivityRecorder  # activity rows and captures
    inflight: InflightTracker  # the requests in flight (`/api/inflight`, cuts at a stop)
    sockets: OpenSockets  # the websockets being relayed
    metrics: ServerMetrics  # `/metrics`
    events: EventFeed  # `/api/events`
    performance: Performance  # `/api/performance`, `/api/hardware`
    profiles: Profiles  # the active profile
    selectors: Selectors  # the selectors' counts
    tasks: Tasks  # the task queue, once the config has one
    peers: PeerWatch  # what the `discover: true` peers say about themselves

    def install(self, app: web.Application) -> None:
        """Put each part under its key, where the routes read it."""
        app[UPSTREAMS] = self.pool
        app[DISPATCHER] = self.dispatcher
        app[RECORDER] = self.recorder
        app[INFLIGHT] = self.inflight
        app[SOCKETS] = self.sockets
        app[METRICS] = self.metrics
        app[FEED] = self.events
        app[PERFORMANCE] = self.performance
        app[PROFILES] = self.profiles
        app[SELECTORS] = self.selectors
        app[TASKS] = self.tasks
        app[PEER_WATCH] = self.peers


def build_services(
    state: ServerState,
    *,
    memory_reader: MemoryReader | None = None,
    feed_options: Mapping[str, Any] | None = None,
) -> Services:
    """Every part, each given what it uses. `memory_reader` replaces the one metrics would open (a fake GPU
    in tests); `feed_options` go to the event feed (its backlog, keep-alive)."""
    pool = UpstreamPool()
    recorder = ActivityRecorder(settings_of(state.config))
    dispatcher = Dispatcher(pool, lambda: state.router)
    dispatcher.recorder = recorder  # tasks and batch requests are recorded as HTTP requests are
    inflight = InflightTracker()
    sockets = OpenSockets()
    metrics = ServerMetrics(state, sockets, reader=memory_reader)
    return Services(
        pool=pool,
        dispatcher=dispatcher,
        recorder=recorder,
        inflight=inflight,
        sockets=sockets,
        metrics=metrics,
        events=EventFeed(state, inflight, recorder=recorder, **(feed_options or {})),
        performance=Performance(state.config, metrics),
        profiles=Profiles(state.config),
        selectors=Selectors(),
        tasks=Tasks(),
        peers=PeerWatch(),
    )


SERVICES: web.AppKey[Services] = web.AppKey("llmswap_services", Services)
