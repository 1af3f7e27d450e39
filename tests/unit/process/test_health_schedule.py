"""The adaptive health-poll schedule and the probed URL."""

import itertools

import pytest

from llmswap.process.health import (
    FIRST_POLL_DELAY,
    MAX_POLL_DELAY,
    POLL_DELAY_FRACTION,
    POLL_GROWTH,
    health_url,
    next_poll_delay,
)


def schedule(total: float) -> list[tuple[float, float]]:
    """(elapsed before the gap, gap) for every gap of a poll lasting `total` seconds (probes take no time)."""
    gaps: list[tuple[float, float]] = []
    elapsed, delay = 0.0, None
    while elapsed < total:
        delay = next_poll_delay(delay, elapsed)
        gaps.append((elapsed, delay))
        elapsed += delay
    return gaps


def test_first_gap_is_ten_milliseconds() -> None:
    assert next_poll_delay(None, 0.0) == FIRST_POLL_DELAY == 0.010


def test_gaps_never_shrink_and_grow_at_most_by_half() -> None:
    gaps = [gap for _, gap in schedule(30.0)]
    for before, after in itertools.pairwise(gaps):
        assert before <= after <= before * POLL_GROWTH + 1e-12


def test_gaps_stay_within_a_small_fraction_of_the_time_waited() -> None:
    for elapsed, gap in schedule(30.0):
        assert gap <= max(FIRST_POLL_DELAY, elapsed * POLL_DELAY_FRACTION) + 1e-12


def test_gaps_reach_and_never_exceed_the_cap() -> None:
    gaps = [gap for _, gap in schedule(30.0)]
    assert max(gaps) == MAX_POLL_DELAY == 0.200
    assert gaps[-1] == MAX_POLL_DELAY


def test_a_one_second_load_is_detected_within_a_few_tens_of_milliseconds() -> None:
    # llama-swap probes at 0.25 s and 1.25 s: a 1.0 s load waits until 1.25 s. Here the probe right after
    # the first second comes far sooner.
    probes = [elapsed for elapsed, _ in schedule(2.0)]
    first_after = min(t for t in probes if t >= 1.0)
    assert first_after - 1.0 <= 0.030


@pytest.mark.parametrize(
    ("proxy", "endpoint", "url"),
    [
        ("http://127.0.0.1:5800", "/health", "http://127.0.0.1:5800/health"),
        ("http://127.0.0.1:5800/", "/health", "http://127.0.0.1:5800/health"),
        ("http://host:8080/base", "/v1/models", "http://host:8080/base/v1/models"),
        ("http://host:8080", "health", "http://host:8080/health"),
        ("http://host:8080", "  /health ", "http://host:8080/health"),
    ],
)
def test_health_url_appends_the_endpoint_to_the_proxy(proxy: str, endpoint: str, url: str) -> None:
    assert health_url(proxy, endpoint) == url


def test_check_endpoint_none_means_no_probe() -> None:
    assert health_url("http://127.0.0.1:5800", "none") is None
    assert health_url("http://127.0.0.1:5800", " none ") is None
