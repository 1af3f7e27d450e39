"""The per-request series of `/metrics`: requests by model, route and status, and the request duration,
time to first byte and queue wait histograms, kept as plain numbers and made into Prometheus families only
when scraped; and the tokens and speeds each request's activity row reports (`TokenMetrics`).

Every answered request updates them once (`RequestMetrics.observe`, from `ServerMetrics.on_request`). The
client library's own Counter and Histogram take a lock and check their labels on every update, a
measurable share of a request's cost; here the updates and the scrape both run on the event loop's
thread, and nothing else writes these numbers, so plain attributes are enough. The families come out as
the client library's Counter and Histogram would expose them, byte for byte: the same names, help, label
order, buckets, sample order and `_created` samples.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client import metrics as client_metrics
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.utils import INF, floatToGoString

from llmswap.activity.record import ActivityRecord
from llmswap.activity.recorder import ActivityRecorder
from llmswap.server.http.middleware import Answered

# Inference requests run from milliseconds (a cached answer) to minutes (a long generation, a cold load).
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

REQUESTS = ("llmswap_requests", "HTTP requests answered, by model, route and status")
DURATION = ("llmswap_request_duration_seconds", "Seconds from a request's arrival to the end of its answer")
FIRST_BYTE = ("llmswap_time_to_first_byte_seconds",
              "Seconds from a request's arrival to the first byte of the upstream's answer sent to the "
              "client")
QUEUE_WAIT = ("llmswap_queue_wait_seconds",
              "Seconds a request waited for its model to be granted (queue and load included)")


def _created_samples() -> bool:
    # The client library's switch for `_created` samples (PROMETHEUS_DISABLE_CREATED_SERIES, or its
    # disable_created_metrics()), read at each scrape as its own metrics read it.
    return bool(getattr(client_metrics, "_use_created", True))


class Buckets:
    """One labelled histogram series: a count per bucket (not cumulative) and the sum."""

    __slots__ = ("bounds", "counts", "created", "labels", "sum")

    def __init__(self, bounds: tuple[float, ...], labels: dict[str, str]) -> None:
        self.bounds = bounds
        self.labels = labels
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()


class Series:
    """What one (model, route, status) updates: its own count, and the histograms it shares with the
    other statuses of its (model, route) and the other routes of its model."""

    __slots__ = ("count", "created", "duration", "first_byte", "labels", "waited")

    def __init__(self, labels: dict[str, str], duration: Buckets) -> None:
        self.labels = labels
        self.count = 0
        self.created = time.time()
        self.duration = duration
        self.first_byte: Buckets | None = None  # the shared series, looked up on first use
        self.waited: Buckets | None = None


class RequestMetrics:
    """The four per-request families, and a collector (`collect`, `describe`) that exposes them."""

    def __init__(self) -> None:
        self.request_bounds = _bounds(REQUEST_BUCKETS)
        self.wait_bounds = _bounds(WAIT_BUCKETS)
        # Each in the order its series were first made: the order the exposition lists them in.
        self.series: dict[tuple[str, str, int], Series] = {}
        self.durations: dict[tuple[str, str], Buckets] = {}
        self.first_bytes: dict[tuple[str, str], Buckets] = {}
        self.waits: dict[str, Buckets] = {}

    def observe(self, answered: Answered) -> None:
        """Count `answered` and observe its durations."""
        model, route = answered.model, answered.route
        series = self.series.get((model, route, answered.status))
        if series is None:
            series = self._new_series(model, route, answered.status)
        series.count += 1
        # Each histogram's update written out (a method call is a share of the cost here). The bucket is
        # the first bound at or above the value, as the client library's `amount <= bound` scan finds it.
        seconds = answered.seconds
        histogram = series.duration
        histogram.sum += seconds
        histogram.counts[bisect_left(histogram.bounds, seconds)] += 1
        seconds = answered.first_byte  # type: ignore[assignment]
        if seconds is not None:
            histogram = series.first_byte or self._first_byte(series, model, route)
            histogram.sum += seconds
            histogram.counts[bisect_left(histogram.bounds, seconds)] += 1
        seconds = answered.waited  # type: ignore[assignment]
        if seconds is not None:
            histogram = series.waited or self._waited(series, model)
            histogram.sum += seconds
            histogram.counts[bisect_left(histogram.bounds, seconds)] += 1

    def _new_series(self, model: str, route: str, status: int) -> Series:
        duration = self.durations.get((model, route))
        if duration is None:
            duration = self.durations[(model, route)] = Buckets(self.request_bounds,
                                                                {"model": model, "route": route})
        series = self.series[(model, route, status)] = Series(
            {"model": model, "route": route, "status": str(status)}, duration)
        return series

    def _first_byte(self, series: Series, model: str, route: str) -> Buckets:
        shared = self.first_bytes.get((model, route))
        if shared is None:
            shared = self.first_bytes[(model, route)] = Buckets(self.request_bounds,
                                                                {"model": model, "route": route})
        series.first_byte = shared
        return shared

    def _waited(self, series: Series, model: str) -> Buckets:
        shared = self.waits.get(model)
        if shared is None:
            shared = self.waits[model] = Buckets(self.wait_bounds, {"model": model})
        series.waited = shared
        return shared

    # ------------------------------------------------------------------ the collector

    def describe(self) -> list[Metric]:
        """The families' names, so the registry refuses another collector that would clash with them."""
        return [Metric(*REQUESTS, "counter"), Metric(*DURATION, "histogram"),
                Metric(*FIRST_BYTE, "histogram"), Metric(*QUEUE_WAIT, "histogram")]

    def collect(self) -> Iterator[Metric]:
        created = _created_samples()
        requests = Metric(*REQUESTS, "counter")
        name = requests.name
        for series in self.series.values():
            requests.add_sample(f"{name}_total", series.labels, float(series.count))
            if created:
                requests.add_sample(f"{name}_created", series.labels, series.created)
        yield requests
        yield _histogram(DURATION, self.durations.values(), created)
        yield _histogram(FIRST_BYTE, self.first_bytes.values(), created)
        yield _histogram(QUEUE_WAIT, self.waits.values(), created)


def _bounds(buckets: tuple[float, ...]) -> tuple[float, ...]:
    return (*(float(bound) for bound in buckets), INF)


def _histogram(family: tuple[str, str], all_series: Iterable[Buckets], created: bool) -> Metric:
    metric = Metric(*family, "histogram")
    name = metric.name
    for series in all_series:
        labels = series.labels
        total = 0.0
        for bound, count in zip(series.bounds, series.counts, strict=True):
            total += count
            metric.add_sample(f"{name}_bucket", {**labels, "le": floatToGoString(bound)}, total)
        metric.add_sample(f"{name}_count", labels, total)
        metric.add_sample(f"{name}_sum", labels, series.sum)
        if created:
            metric.add_sample(f"{name}_created", labels, series.created)
    return metric


# -------------------------------------------------------------------------------- tokens

# Token counts and speeds on `/metrics`, from each activity record as it is stored.
#
#     llmswap_tokens_total{model,kind}                      kind: input, output, cached, drafted, accepted
#     llmswap_prompt_tokens_per_second{model}               histogram of prompt processing speeds
#     llmswap_generation_tokens_per_second{model}           histogram of generation speeds
#
# Counts the answer did not report (-1) are left out, as are speeds of 0 or less (not reported). The
# token counts are plain integers added to per record and read by a collector at scrape time: most answers
# report counts, and five prometheus counter increments (a lock each) would cost more than the rest of
# the record's bookkeeping.

KINDS = ("input", "output", "cached", "drafted", "accepted")
HELP = "Tokens reported by upstream answers, by model and kind"
SPEED_BUCKETS = (1, 2.5, 5, 10, 20, 30, 50, 75, 100, 150, 250, 500, 1000, 2500, 5000, 10000)


class TokenMetrics:
    def __init__(self, registry: CollectorRegistry, recorder: ActivityRecorder) -> None:
        self.recorder = recorder
        # model → [input, output, cached, drafted, accepted] (the order of KINDS), and when it was first seen
        self.counts: dict[str, list[int]] = {}
        self.created: dict[str, float] = {}
        registry.register(_TokenCounts(self))
        self.prompt_speed = Histogram(
            "llmswap_prompt_tokens_per_second", "Prompt processing speed reported per request (tokens/s)",
            ("model",), buckets=SPEED_BUCKETS, registry=registry)
        self.generation_speed = Histogram(
            "llmswap_generation_tokens_per_second", "Generation speed reported per request (tokens/s)",
            ("model",), buckets=SPEED_BUCKETS, registry=registry)
        self._speeds: dict[str, tuple[Any, Any]] = {}

    def on_record(self, record: ActivityRecord) -> None:
        t = record.tokens
        counted = t.input_tokens > 0 or t.output_tokens > 0 or t.cache_tokens > 0 or t.draft_tokens > 0 \
            or t.draft_acc_tokens > 0
        prompt_speed, generation_speed = t.prompt_per_second, t.tokens_per_second
        if not counted and prompt_speed <= 0 and generation_speed <= 0:
            return
        model = record.model
        counts = self.counts.get(model)
        if counts is None:  # a model's series appear together, the first time it reports anything
            counts = self.counts[model] = [0, 0, 0, 0, 0]
            self.created[model] = time.time()
            # looked up once per model: labels() costs more than the observation
            self._speeds[model] = (self.prompt_speed.labels(model), self.generation_speed.labels(model))
        if counted:
            for index, count in enumerate((t.input_tokens, t.output_tokens, t.cache_tokens, t.draft_tokens,
                                           t.draft_acc_tokens)):
                if count > 0:
                    counts[index] += count
        if prompt_speed > 0 or generation_speed > 0:
            series = self._speeds[model]
            if prompt_speed > 0:
                series[0].observe(prompt_speed)
            if generation_speed > 0:
                series[1].observe(generation_speed)


class _TokenCounts:
    """`llmswap_tokens_total`, read from `TokenMetrics.counts` at scrape time."""

    def __init__(self, metrics: TokenMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        # Registered before the speed histograms: settling here updates them too before they are read.
        self.metrics.recorder.settle()
        family = CounterMetricFamily("llmswap_tokens", HELP, labels=("model", "kind"))
        created = self.metrics.created
        for model, counts in list(self.metrics.counts.items()):
            for kind, count in zip(KINDS, tuple(counts), strict=True):
                family.add_metric((model, kind), count, created=created.get(model))
        yield family


def count_tokens(registry: CollectorRegistry, recorder: ActivityRecorder) -> TokenMetrics:
    """Count the tokens of every row `recorder` keeps into `registry`."""
    token_metrics = TokenMetrics(registry, recorder)
    recorder.listeners.append(token_metrics.on_record)
    return token_metrics
