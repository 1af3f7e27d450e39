"""The pure parts under the schedulers: time estimates, client gaps, the batch planner's arithmetic."""

from __future__ import annotations

import math

import pytest

from llmswap.scheduler.batch_plan import (
    Contender,
    by_choice,
    by_deadline,
    can_go_first,
    first_latest_start,
    latest_starts,
    urgency,
)
from llmswap.scheduler.estimates import GAP_WINDOW, ServiceTimes, Smoothed, retry_after
from llmswap.scheduler.idle import GRACE_DEFAULT, GRACE_MAX, GRACE_MIN, ClientGaps

# ================================================================ estimates


def test_estimates_use_defaults_until_something_is_observed():
    times = ServiceTimes(default_service=1.0, default_load=5.0)
    assert (times.service("a"), times.load("a")) == (1.0, 5.0)
    assert times.service_upper("a") > times.service("a")
    assert times.observed("a") == (0, 0)


def test_estimates_follow_observations_smoothly():
    times = ServiceTimes()
    times.observe_service("a", 4.0)
    assert times.service("a") == 4.0
    times.observe_service("a", 14.0)  # one slow request moves the estimate, it does not take it over
    assert 4.0 < times.service("a") < 14.0
    assert times.service_upper("a") > times.service("a")
    for _ in range(30):
        times.observe_service("a", 2.0)
    assert times.service("a") == pytest.approx(2.0, abs=0.01)
    assert times.service_upper("a") == pytest.approx(2.0, abs=0.05)


def test_an_unobserved_model_is_assumed_to_be_like_the_observed_ones():
    times = ServiceTimes(default_load=5.0)
    times.observe_load("a", 8.0)
    times.observe_load("b", 12.0)
    assert times.load("c") == 10.0
    assert times.load("a") == 8.0


def test_adopting_estimates_copies_only_the_named_models():
    old = ServiceTimes()
    old.observe_service("kept", 3.0)
    old.observe_load("kept", 20.0)
    old.observe_load("changed", 90.0)
    new = ServiceTimes()
    new.adopt(old, ["kept", "never-seen"])
    assert (new.service("kept"), new.load("kept")) == (3.0, 20.0)
    assert new.observed("kept") == (1, 1)
    assert new.observed("changed") == (0, 0)  # its config changed: what was learned may no longer hold
    old.observe_load("kept", 40.0)  # copies, not shared: the retiring scheduler keeps learning alone
    assert new.load("kept") == 20.0


def test_per_request_cost_is_the_mean_gap_between_completions_over_a_window():
    times = ServiceTimes(default_service=1.0)
    assert times.per_request("a") == 1.0  # nothing seen: the service time stands in
    times.observe_service("a", 6.0)
    assert times.per_request("a") == 6.0
    for gap in (6.0, 0.0, 0.0):  # three served at once
        times.observe_gap("a", gap)
    assert times.per_request("a") == 2.0
    for _ in range(GAP_WINDOW):  # old gaps leave the window
        times.observe_gap("a", 5.0)
    assert times.per_request("a") == 5.0
    adopted = ServiceTimes()
    adopted.adopt(times, ["a"])
    assert adopted.per_request("a") == 5.0


def test_smoothed_deviation_tracks_spread():
    s = Smoothed(0.0, 0.0)
    for value in [1.0, 3.0] * 20:
        s.add(value)
    assert 1.5 < s.mean < 2.5 and 0.5 < s.deviation < 1.5


@pytest.mark.parametrize(("seconds", "expected"), [(0.0, 1.0), (0.2, 1.0), (1.0, 1.0), (1.01, 2.0),
                                                   (14.5, 15.0), (30.0, 30.0), (math.inf, 1.0)])
def test_retry_after_rounds_up_to_whole_seconds_at_least_one(seconds, expected):
    assert retry_after(seconds) == expected


# ================================================================ client gaps (idleness)


def test_grace_defaults_until_a_gap_is_seen():
    gaps = ClientGaps()
    assert gaps.grace("a") == GRACE_DEFAULT
    assert gaps.quiet_from("a") is None
    gaps.finished("a", 100.0)
    assert gaps.quiet_from("a") == 100.0 + GRACE_DEFAULT


def test_grace_is_a_multiple_of_the_observed_think_time_within_bounds():
    gaps = ClientGaps()
    gaps.finished("a", 0.0)
    gaps.arrived("a", 0.05, quiet=True)
    assert gaps.grace("a") == GRACE_MIN  # 3 x 50 ms is below the floor
    slow = ClientGaps()
    for t in range(5):
        slow.finished("b", 10.0 * t)
        slow.arrived("b", 10.0 * t + 0.5, quiet=True)
    assert slow.grace("b") == pytest.approx(1.5)
    slower = ClientGaps()
    slower.finished("c", 0.0)
    slower.arrived("c", 2.5, quiet=True)
    assert slower.grace("c") == GRACE_MAX


def test_gaps_longer_than_the_maximum_grace_are_departures_not_think_time():
    gaps = ClientGaps()
    gaps.finished("a", 0.0)
    gaps.arrived("a", 60.0, quiet=True)
    assert gaps.grace("a") == GRACE_DEFAULT
    assert gaps.returning("a") < 1.0


def test_overlapping_requests_teach_nothing():
    gaps = ClientGaps()
    gaps.finished("a", 0.0)
    gaps.arrived("a", 0.01, quiet=False)  # another request of a was still in flight
    assert gaps.grace("a") == GRACE_DEFAULT and gaps.returning("a") == 1.0


# ================================================================ the batch planner's arithmetic


def c(model: str, oldest: float, slot: float = 10.0, depth: int = 1, mp: int = 0, rp: int = 0) -> Contender:
    return Contender(model, depth, oldest, mp, rp, slot)


def test_latest_starts_walk_back_from_the_last_deadline():
    ordered = by_deadline([c("b", 0.0, slot=10.0), c("c", 5.0, slot=8.0), c("d", 40.0)], max_wait=30.0)
    assert [x.model for x in ordered] == ["b", "c", "d"]
    # d: its deadline 70; c: min(35, 70 - 8) = 35; b: min(30, 35 - 10) = 25
    assert latest_starts(ordered, 30.0) == [25.0, 35.0, 70.0]
    assert first_latest_start([], 30.0) == math.inf


def test_deadline_ties_break_by_priority_then_arrival_then_model():
    ordered = by_deadline([c("z", 0.0), c("y", 0.0), c("x", 0.0, rp=1), c("w", 0.0, mp=1)], max_wait=30.0)
    assert [x.model for x in ordered] == ["w", "x", "y", "z"]


def test_urgency_grows_with_depth_and_age():
    assert urgency(c("a", 100.0, depth=3), now=100.0, max_wait=30.0) == 3.0
    assert urgency(c("a", 70.0, depth=1), now=100.0, max_wait=30.0) == 2.0
    assert urgency(c("a", 100.0, depth=2), now=110.0, max_wait=0.0) == 22.0  # no maxWait: age in seconds


def test_choice_orders_priority_then_urgency_then_arrival_then_model():
    now = 100.0
    deep = c("deep", 99.0, depth=4)
    old = c("old", 70.0, depth=1)
    vip = c("vip", 99.5, depth=1, mp=1)
    urgent = c("urgent", 99.5, depth=1, rp=9)
    tie_b, tie_a = c("tie-b", 99.0, depth=1), c("tie-a", 99.0, depth=1)
    order = by_choice([tie_b, old, deep, urgent, tie_a, vip], now, max_wait=30.0)
    assert [x.model for x in order] == ["vip", "urgent", "deep", "old", "tie-a", "tie-b"]


def test_a_contender_may_go_first_only_if_the_others_still_make_their_deadlines():
    now = 100.0
    near = c("near", 75.0, slot=15.0)  # deadline 105
    deep = c("deep", 99.0, slot=15.0, depth=5)
    assert not can_go_first(deep, [near, deep], now, max_wait=30.0)
    assert can_go_first(near, [near, deep], now, max_wait=30.0)
    assert can_go_first(deep, [deep], now, max_wait=30.0)
