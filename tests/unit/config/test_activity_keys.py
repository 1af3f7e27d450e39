"""`metricsMaxInMemory`, `captureBuffer`, `store:` and `performance:`."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmswap.config.activity_section import parse_duration

from .support import load, one_error


def test_activity_defaults_are_llama_swaps() -> None:
    config = load("models: {}\n")
    assert (config.activity.max_in_memory, config.activity.capture_mb, config.activity.store_path) == (
        1000, 5.0, None)
    assert (config.performance.disabled, config.performance.every) == (False, 5.0)


def test_activity_keys_are_read(tmp_path: Path) -> None:
    db = tmp_path / "activity.db"
    config = load(f"metricsMaxInMemory: 20\ncaptureBuffer: 0\nstore: {{path: {db}, retention: 50}}\n"
                  "performance: {disabled: true, every: 1m30s}\n")
    assert (config.activity.max_in_memory, config.activity.capture_mb) == (20, 0.0)
    assert (config.activity.store_path, config.activity.store_retention) == (db, 50)
    assert (config.performance.disabled, config.performance.every) == (True, 90.0)


def test_metrics_max_in_memory_at_or_below_zero_means_the_default() -> None:
    assert load("metricsMaxInMemory: 0\n").activity.max_in_memory == 1000


def test_store_path_must_not_be_empty() -> None:
    assert one_error("store: {path: ''}\n") == (
        "config.yaml:1: store.path: store.path must not be empty; give a file for the activity database")


def test_store_path_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    message = one_error(f"store:\n  path: {tmp_path}\n")
    assert message == (f"config.yaml:2: store.path: store.path: {tmp_path} is a directory, not a file; "
                       "name a file inside it")


def test_store_path_in_a_missing_directory_is_refused(tmp_path: Path) -> None:
    assert "does not exist; create it" in one_error(f"store:\n  path: {tmp_path}/no/such/a.db\n")


def test_performance_every_below_five_seconds_is_refused() -> None:
    assert one_error("performance:\n  every: 4s\n") == (
        "config.yaml:2: performance.every: performance: every must be at least 5s, got 4s")


def test_performance_every_must_be_a_duration() -> None:
    assert "must be a duration such as 5s" in one_error("performance: {every: soon}\n")


def test_capture_buffer_must_be_a_number() -> None:
    message = one_error("captureBuffer: lots\n")
    assert message.startswith("config.yaml:1: captureBuffer: must be a size in MiB")


@pytest.mark.parametrize(("text", "seconds"), [("5s", 5), ("1m30s", 90), ("1h", 3600), ("0", 0),
                                               ("1.5s", 1.5), ("250ms", 0.25)])
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)
