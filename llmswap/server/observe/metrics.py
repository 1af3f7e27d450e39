"""Prometheus metrics at `/metrics`: what the proxy served, how long it waited, what it swapped and why.

One `ServerMetrics` per app, with its own `CollectorRegistry` (never the global one: two apps in one
process, or a test suite, must not share counters). Three sources feed it:

- every answered request (`REQUEST_OBSERVERS`, an `Answered` each):
  requests by model, route and status; request duration, time to the first upstream byte and the wait
  for the router's grant (`llmswap.server.observe.request_metrics`: plain numbers, made into families when
  scraped);
- router observers (on every router a config reload installs, see `ServerState.watch_router`): model
  starts, restarts (starts after a model's first), unexpected exits, start failures, load durations (from
  `ready` events) and swap durations;
- the live state, read at scrape time by `RouterCollector`: queue depth, in-flight requests and state per
  model, running models, swaps by rule, evictions, swap failures and rejections (the routers' and
  schedulers' own counters, summed over every router this server has had so that a reload never makes a
  counter go backwards), footprints and memory readings.

Labels stay low-cardinality: `model` is a configured model id (or a peer's model name), `route` is the
route's pattern (`/logs/stream/{log_id}`, `unmatched` for a 404), never the raw path.

Series (counters end in `_total`, histograms have `_bucket`/`_sum`/`_count`):

    llmswap_requests_total{model,route,status}            llmswap_request_duration_seconds{model,route}
    llmswap_time_to_first_byte_seconds{model,route}       llmswap_queue_wait_seconds{model}
    llmswap_queue_depth{model}                            llmswap_in_flight{model}
    llmswap_model_loading{model}                          llmswap_model_state{model,state}  (1 or 0)
    llmswap_running_models                                llmswap_swaps_total{rule}
    llmswap_evictions_total{model}                        llmswap_swap_failures_total
    llmswap_swap_duration_seconds{model,outcome}          llmswap_model_load_duration_seconds{model}
    llmswap_model_starts_total{model}                     llmswap_upstream_restarts_total{model}
    llmswap_upstream_unexpected_exits_total{model}        llmswap_model_start_failures_total{model}
    llmswap_rejections_total{reason}                      llmswap_info{version,router}
    llmswap_websockets_open{model}                        llmswap_preemptions_total{reason}
    llmswap_deadline_misses_total
    llmswap_memory_total_bytes{device,name,reader}        llmswap_memory_used_bytes{device,name,reader}
    vram router only: llmswap_model_footprint_bytes{model}, llmswap_vram_budget_bytes{device},
                      llmswap_vram_in_use_bytes{device}
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from llmswap import __version__
from llmswap.machine import MemoryReader, open_reader
from llmswap.process.events import ProcessEvent
from llmswap.process.state import ProcessState
from llmswap.router.router import Router
from llmswap.router.types import RouterEvent, RouterStats, SwapFinished
from llmswap.server.http.middleware import REQUEST_OBSERVERS, Answered
from llmswap.server.inference.websocket import OpenSockets
from llmswap.server.observe.activity import RECORDER
from llmswap.server.observe.request_metrics import RequestMetrics
from llmswap.server.state import ServerState

log = logging.getLogger("llmswap.metrics")


LOAD_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)


class ServerMetrics:
    """The app's registry and the series the request path and the router observers update."""

    def __init__(self, server_state: ServerState, sockets: OpenSockets, *,
                 reader: MemoryReader | None = None) -> None:
        self.state = server_state
        self.sockets = sockets
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        # The per-request families first: where the client library's own Counter and Histograms were.
        self.request_series = RequestMetrics()
        r.register(self.request_series)
        self.load_seconds = Histogram(
            "llmswap_model_load_duration_seconds", "Seconds from spawning an upstream to its being ready",
            ("model",), buckets=LOAD_BUCKETS, registry=r)
        self.swap_seconds = Histogram(
            "llmswap_swap_duration_seconds", "Seconds a swap took, evictions included, by outcome",
            ("model", "outcome"), buckets=LOAD_BUCKETS, registry=r)
        self.swap_phases = Histogram(
            "llmswap_swap_phase_seconds", "Seconds each phase of a swap took: drain, save, stop (the "
            "victim's), prefetch, start, restore, wake (the model started)", ("phase", "model"),
            buckets=LOAD_BUCKETS, registry=r)
        self.starts = Counter("llmswap_model_starts", "Upstream starts", ("model",), registry=r)
        self.restarts = Counter("llmswap_upstream_restarts",
                                "Upstream starts after the model's first one", ("model",), registry=r)
        self.unexpected_exits = Counter("llmswap_upstream_unexpected_exits",
                                        "Upstreams that exited without being asked to", ("model",),
                                        registry=r)
        self.start_failures = Counter("llmswap_model_start_failures",
                                      "Upstream starts that failed (exit, health-check timeout, spawn error)",
                                      ("model",), registry=r)
        self.sleeps = Histogram(
            "llmswap_model_sleep_duration_seconds", "Seconds a model's sleep or wake call took (`sleep:` and "
            "`wake:` models)", ("model", "action"), buckets=LOAD_BUCKETS, registry=r)
        kv = ("model", "action")
        self.kv_operations = Counter(
            "llmswap_kvcache_operations", "Slot saves (before a stop) and restores (after a start) of "
            "kvCache models, by outcome", (*kv, "outcome"), registry=r)
        self.kv_slots = Counter("llmswap_kvcache_slots", "Slots saved or restored", kv, registry=r)
        self.kv_tokens = Counter("llmswap_kvcache_tokens", "Tokens saved or restored", kv, registry=r)
        self.kv_bytes = Counter("llmswap_kvcache_bytes", "Bytes written by saves, read by restores", kv,
                                registry=r)
        self.kv_seconds = Histogram("llmswap_kvcache_duration_seconds",
                                    "Seconds a model's save or restore took", kv, buckets=LOAD_BUCKETS,
                                    registry=r)
        self.kv_skipped = Counter(
            "llmswap_kvcache_skipped_saves", "Slots not saved before a stop because processing their tokens "
            "again was expected to be cheaper (kvCache.save: auto)", ("model",), registry=r)
        self._started_once: set[str] = set()
        self._routers_seen: list[tuple[RouterStats, Any]] = []  # (router stats, scheduler stats or None)
        self._own_reader = reader
        self._reader_opened = reader is not None
        self.registry.register(RouterCollector(self))

    # ------------------------------------------------------------------ feeding

    def watch(self, router: Router) -> None:
        """Observe `router` (each router a server ever has: its counters stay part of the totals)."""
        if all(stats is not router.stats for stats, _ in self._routers_seen):
            self._routers_seen.append((router.stats, getattr(router.scheduler, "stats", None)))
        # A successor router may have inherited the observer from its predecessor (handover).
        if self.on_router_event not in router.observers:
            router.add_observer(self.on_router_event)

    def on_router_event(self, item: RouterEvent) -> None:
        if isinstance(item, SwapFinished):
            outcome = "ok" if item.error is None else "failed"
            self.swap_seconds.labels(item.plan.model, outcome).observe(item.duration)
            for phase in item.phases:
                self.swap_phases.labels(phase.phase, phase.model).observe(phase.seconds)
            return
        if not isinstance(item, ProcessEvent):
            return
        model = item.model
        if item.kv is not None:
            kv = item.kv
            self.kv_operations.labels(model, kv.action, "failed" if kv.failed else "ok").inc()
            self.kv_slots.labels(model, kv.action).inc(kv.slots)
            self.kv_tokens.labels(model, kv.action).inc(kv.tokens)
            self.kv_bytes.labels(model, kv.action).inc(kv.bytes)
            self.kv_seconds.labels(model, kv.action).observe(kv.seconds)
            if kv.skipped:
                self.kv_skipped.labels(model).inc(kv.skipped)
        elif item.kind in ("slept", "woke"):
            action = "sleep" if item.kind == "slept" else "wake"
            self.sleeps.labels(model, action).observe(item.duration or 0.0)
        elif item.kind == "starting":
            self.starts.labels(model).inc()
            if model in self._started_once:
                self.restarts.labels(model).inc()
            self._started_once.add(model)
        elif item.kind == "ready":
            if item.duration is not None:
                self.load_seconds.labels(model).observe(item.duration)
        elif item.kind == "exited":
            self.unexpected_exits.labels(model).inc()
        elif item.kind == "start_failed":
            self.start_failures.labels(model).inc()

    def on_request(self, answered: Answered) -> None:
        """Count an answered request (the app's observer is `request_series.observe` itself: one call
        less on every request)."""
        self.request_series.observe(answered)

    # ------------------------------------------------------------------ reading

    def exposition(self) -> bytes:
        """The Prometheus text format of every series."""
        return generate_latest(self.registry)

    def totals(self) -> tuple[dict[str, int], dict[str, int], int, dict[str, int]]:
        """(swaps by rule, evictions by model, swap failures, rejections by reason) over every router seen."""
        swaps: dict[str, int] = {}
        evictions: dict[str, int] = {}
        failures = 0
        rejected: dict[str, int] = {}
        for stats, scheduler_stats in self._routers_seen:
            _add(swaps, stats.swaps_by_rule)
            _add(evictions, stats.evictions)
            failures += stats.swap_failures
            if scheduler_stats is not None:
                _add(rejected, getattr(scheduler_stats, "rejected", {}))
        return swaps, evictions, failures, rejected

    def preemptions(self) -> dict[str, int]:
        """In-flight requests preempted for higher-priority ones, by reason, over every router seen."""
        counts: dict[str, int] = {}
        for _, scheduler_stats in self._routers_seen:
            if scheduler_stats is not None:
                _add(counts, getattr(scheduler_stats, "preempted", {}))
        return counts

    def deadline_misses(self) -> int:
        """Waiting requests that could no longer meet their deadline, over every router seen."""
        return sum(getattr(scheduler_stats, "deadline_missed", 0)
                   for _, scheduler_stats in self._routers_seen if scheduler_stats is not None)

    def memory_reader(self) -> MemoryReader | None:
        """The vram router's own reader when it has one, else one opened here on first use."""
        router_reader = self.state.router.policy.memory_reader
        if router_reader is not None:
            return router_reader
        if not self._reader_opened:
            self._reader_opened = True
            try:
                self._own_reader = open_reader(logger=log)
            except Exception:
                log.exception("metrics: no memory reader could be opened; memory series are left out")
        return self._own_reader

    def close(self) -> None:
        if self._own_reader is not None:
            self._own_reader.close()


def _add(into: dict[str, int], counts: Mapping[str, int]) -> None:
    for key, count in counts.items():
        into[key] = into.get(key, 0) + count


class RouterCollector:
    """Series read from the live router (and the memory reader) at scrape time."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        server = self.metrics.state
        router = server.router
        snapshot = router.snapshot()
        models = sorted(router.processes)

        info = GaugeMetricFamily("llmswap_info", "llmswap's version and router", labels=("version", "router"))
        info.add_metric((__version__, router.name), 1)
        yield info

        depth = GaugeMetricFamily("llmswap_queue_depth", "Requests waiting for their model",
                                  labels=("model",))
        in_flight = GaugeMetricFamily("llmswap_in_flight", "Requests being served", labels=("model",))
        loading = GaugeMetricFamily("llmswap_model_loading", "1 while a swap to the model is under way",
                                    labels=("model",))
        for model in models:
            depth.add_metric((model,), snapshot.waiting.get(model, 0))
            # Requests a predecessor router still serves after a reload are in flight all the same.
            serving = snapshot.in_flight.get(model, 0) + router.inherited_in_flight(model)
            in_flight.add_metric((model,), serving)
            loading.add_metric((model,), 1 if model in snapshot.loading else 0)
        yield from (depth, in_flight, loading)

        states = GaugeMetricFamily("llmswap_model_state", "1 for the state each model's upstream is in",
                                   labels=("model", "state"))
        running = 0
        for model in models:
            current = router.model_state(model)
            running += 1 if current is not None and current.is_running else 0
            for each in ProcessState:
                states.add_metric((model, each.value), 1 if each is current else 0)
        yield states
        yield GaugeMetricFamily("llmswap_running_models", "Upstreams starting, ready or stopping", running)

        swaps, evictions, failures, rejected = self.metrics.totals()
        yield _counter("llmswap_swaps", "Swaps started, by the scheduler's rule", "rule", swaps)
        yield _counter("llmswap_evictions", "Models stopped to make room for another", "model", evictions)
        yield CounterMetricFamily("llmswap_swap_failures", "Swaps that ended without the model ready",
                                  failures)
        yield _counter("llmswap_rejections", "Requests refused or dropped by admission control", "reason",
                       rejected)
        yield _counter("llmswap_preemptions", "In-flight requests preempted for higher-priority ones",
                       "reason", self.metrics.preemptions())
        yield CounterMetricFamily("llmswap_deadline_misses",
                                  "Waiting requests that could no longer meet their deadline (X-Deadline-Ms)",
                                  self.metrics.deadline_misses())

        sockets = GaugeMetricFamily("llmswap_websockets_open", "Websockets being relayed to a model",
                                    labels=("model",))
        for model, count in sorted(self.metrics.sockets.per_model().items()):
            sockets.add_metric((model,), count)
        yield sockets

        yield from _footprints(router, models)
        yield from _memory(self.metrics.memory_reader())


def _counter(name: str, documentation: str, label: str, counts: Mapping[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=(label,))
    for key in sorted(counts):
        family.add_metric((key,), counts[key])
    return family


def _footprints(router: Router, models: Iterable[str]) -> Iterator[Metric]:
    footprint = GaugeMetricFamily("llmswap_model_footprint_bytes",
                                  "A model's memory footprint as the vram router knows it", labels=("model",))
    seen = False
    for model in models:
        vram = router.model_extras(model).get("vram")
        if isinstance(vram, Mapping) and isinstance(vram.get("footprint"), int):
            footprint.add_metric((model,), vram["footprint"])
            seen = True
    if seen:
        yield footprint
    devices = router.router_extras().get("vram", {}).get("devices", {})
    if devices:
        budget = GaugeMetricFamily("llmswap_vram_budget_bytes", "Memory the vram router may fill per device",
                                   labels=("device",))
        in_use = GaugeMetricFamily("llmswap_vram_in_use_bytes",
                                   "Footprints of the running models per device", labels=("device",))
        for device, numbers in sorted(devices.items()):
            budget.add_metric((device,), numbers.get("budget", 0))
            in_use.add_metric((device,), numbers.get("in_use", 0))
        yield from (budget, in_use)


def _memory(reader: MemoryReader | None) -> Iterator[Metric]:
    if reader is None:
        return
    try:
        devices = reader.devices()
    except Exception:
        log.exception("metrics: reading memory from the %s reader failed", reader.kind)
        return
    labels = ("device", "name", "reader")
    total = GaugeMetricFamily("llmswap_memory_total_bytes", "Device memory (GPU, or host RAM)", labels=labels)
    used = GaugeMetricFamily("llmswap_memory_used_bytes", "Device memory in use", labels=labels)
    for device in devices:
        key = (str(device.index), device.name, reader.kind)
        total.add_metric(key, device.total)
        used.add_metric(key, device.used)
    yield from (total, used)


# ---------------------------------------------------------------------------------------------- the app


METRICS: web.AppKey[ServerMetrics] = web.AppKey("llmswap_metrics", ServerMetrics)


def setup(app: web.Application) -> None:
    metrics = app[METRICS]
    app[REQUEST_OBSERVERS].append(metrics.request_series.observe)
    app.router.add_get("/metrics", scrape)
    app.on_cleanup.append(_close)


async def scrape(request: web.Request) -> web.Response:
    request.app[RECORDER].settle()
    body = request.app[METRICS].exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _close(app: web.Application) -> None:
    app[METRICS].close()
