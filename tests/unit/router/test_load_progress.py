"""`LoadProgress`: a load's estimate from the model's measured load times, never done before the model is."""

from __future__ import annotations

from llmswap.router.types import LoadProgress


def test_the_estimate_is_the_time_so_far_against_the_measured_load_time() -> None:
    assert LoadProgress("m", 1.0, 4.0).fraction == 0.25
    assert LoadProgress("m", 9.0, 4.0).fraction == 0.99  # slower than before: still not done
    assert LoadProgress("m", 1.0, None).fraction is None  # never loaded before: no estimate
    assert LoadProgress("m", 1.234, 4.0).as_dict() == {
        "model": "m", "elapsed_seconds": 1.23, "expected_seconds": 4.0, "progress": 0.308}
