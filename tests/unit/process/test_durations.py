"""Go-style duration text, as llama-swap's error messages print it."""

import pytest

from llmswap.process.durations import format_go_duration


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (15, "15s"),
        (120, "2m0s"),
        (90, "1m30s"),
        (1.5, "1.5s"),
        (0.5, "500ms"),
        (0.0015, "1.5ms"),
        (0.000_25, "250µs"),
        (0.000_000_5, "500ns"),
        (3600, "1h0m0s"),
        (3725.25, "1h2m5.25s"),
        (61.001, "1m1.001s"),
        (-2, "-2s"),
    ],
)
def test_format_go_duration_matches_go(seconds: float, text: str) -> None:
    assert format_go_duration(seconds) == text


def test_format_go_duration_has_no_float_noise() -> None:
    assert format_go_duration(0.1 + 0.2) == "300ms"
    assert format_go_duration(2.3) == "2.3s"
