"""The bounded log ring's history (live tails are tested under tests/integration/process)."""

import pytest

from llmswap.process.logring import LogRing


def test_history_keeps_the_last_lines_in_order() -> None:
    ring = LogRing("m", capacity=3)
    for index in range(5):
        ring.append(f"line {index}")
    assert ring.history() == ["line 2", "line 3", "line 4"]
    assert len(ring) == 3
    assert ring.total == 5


def test_entries_carry_a_timestamp_from_the_given_clock() -> None:
    ticks = iter([10.0, 11.5])
    ring = LogRing("m", wall_clock=lambda: next(ticks))
    ring.append("a")
    ring.append("b")
    assert [(entry.timestamp, entry.line) for entry in ring.entries()] == [(10.0, "a"), (11.5, "b")]


def test_tail_limits_to_lines_after_a_mark() -> None:
    ring = LogRing("m", capacity=10)
    ring.append("old")
    mark = ring.total
    ring.append("new 1")
    ring.append("new 2")
    assert ring.tail(5) == ["old", "new 1", "new 2"]
    assert ring.tail(5, since=mark) == ["new 1", "new 2"]
    assert ring.tail(1, since=mark) == ["new 2"]
    assert ring.tail(5, since=ring.total) == []


def test_tail_after_the_ring_wrapped() -> None:
    ring = LogRing("m", capacity=2)
    mark = ring.total
    for index in range(4):
        ring.append(str(index))
    assert ring.tail(10, since=mark) == ["2", "3"]


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity must be >= 1, got 0"):
        LogRing("m", capacity=0)
