"""The per-request families, kept as plain numbers, expose exactly what the client library's own Counter and
Histograms expose for the same observations (no event loop, no processes)."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client import metrics as client_metrics
from prometheus_client.registry import DuplicateTimeseries

from llmswap.server.http.middleware import Answered
from llmswap.server.observe.request_metrics import (
    DURATION,
    FIRST_BYTE,
    QUEUE_WAIT,
    REQUEST_BUCKETS,
    REQUESTS,
    WAIT_BUCKETS,
    RequestMetrics,
)

CHAT = "/v1/chat/completions"


def answered(model: str, route: str, status: int, seconds: float, *, waited: float | None = None,
             first_byte: float | None = None) -> Answered:
    return Answered("POST", route, route, "127.0.0.1", model, status, seconds, waited=waited,
                    first_byte=first_byte)


# Every bucket edge, values between and beyond them, statuses sharing a (model, route), optional timings
# appearing first on a later status, a route without a model.
OBSERVATIONS = [
    answered("a", CHAT, 200, 0.005, waited=0.001, first_byte=0.004),
    answered("a", CHAT, 200, 0.0051, waited=0.0009),
    answered("a", CHAT, 502, 1.0, first_byte=0.5),
    answered("b", CHAT, 200, 600.0, waited=300.0, first_byte=600.0),
    answered("b", CHAT, 200, 601.5, waited=301.0, first_byte=700.0),
    answered("a", "/v1/embeddings", 200, 0.0),
    answered("", "unmatched", 404, 0.0003),
    answered("b", "/v1/embeddings", 499, 2.5, waited=2.5),
    *(answered("a", CHAT, 200, bound, waited=wait, first_byte=bound / 2)
      for bound, wait in zip(REQUEST_BUCKETS, (*WAIT_BUCKETS, 0.3), strict=True)),
    answered("a", CHAT, 200, 0.1 + 0.2, waited=0.1 + 0.2, first_byte=0.1 + 0.2),
]


def reference(observations: list[Answered]) -> bytes:
    """What the client library's own metrics expose for `observations`, updated as llmswap used to."""
    registry = CollectorRegistry(auto_describe=False)
    requests = Counter(*REQUESTS, ("model", "route", "status"), registry=registry)
    duration = Histogram(*DURATION, ("model", "route"), buckets=REQUEST_BUCKETS, registry=registry)
    first_byte = Histogram(*FIRST_BYTE, ("model", "route"), buckets=REQUEST_BUCKETS, registry=registry)
    waited = Histogram(*QUEUE_WAIT, ("model",), buckets=WAIT_BUCKETS, registry=registry)
    for each in observations:
        requests.labels(each.model, each.route, str(each.status)).inc()
        duration.labels(each.model, each.route).observe(each.seconds)
        if each.first_byte is not None:
            first_byte.labels(each.model, each.route).observe(each.first_byte)
        if each.waited is not None:
            waited.labels(each.model).observe(each.waited)
    return generate_latest(registry)


def exposed(observations: list[Answered]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    metrics = RequestMetrics()
    registry.register(metrics)
    for each in observations:
        metrics.observe(each)
    return generate_latest(registry)


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """One wall-clock time for every series made, so `_created` samples compare too."""
    monkeypatch.setattr(time, "time", lambda: 1_764_000_000.25)


@pytest.mark.usefixtures("frozen_clock")
def test_request_families_expose_what_the_client_librarys_metrics_do_byte_for_byte() -> None:
    expected = reference(OBSERVATIONS)
    assert b'le="+Inf"' in expected and b"_created{" in expected  # the comparison covers both
    assert exposed(OBSERVATIONS) == expected


@pytest.mark.usefixtures("frozen_clock")
def test_request_families_expose_their_help_and_type_before_any_request() -> None:
    assert exposed([]) == reference([])


@pytest.mark.usefixtures("frozen_clock")
def test_request_families_leave_out_created_samples_when_the_client_library_is_told_to() -> None:
    was_on = getattr(client_metrics, "_use_created", True)
    client_metrics.disable_created_metrics()
    try:
        expected = reference(OBSERVATIONS)
        assert b"_created" not in expected
        assert exposed(OBSERVATIONS) == expected
    finally:
        if was_on:
            client_metrics.enable_created_metrics()


def test_a_registry_refuses_a_second_collector_of_the_request_families() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RequestMetrics())
    with pytest.raises(DuplicateTimeseries):
        Counter(*REQUESTS, ("model", "route", "status"), registry=registry)
