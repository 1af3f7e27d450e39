"""The garbage collector as a serving llmswap sets it: long-lived objects frozen, young ones collected
rarely, and reference cycles still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from llmswap.server.lifecycle import SERVING_GC_THRESHOLDS, settle_garbage_collector


@pytest.fixture
def restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.mark.usefixtures("restore_gc")
def test_settling_freezes_what_exists_and_raises_the_young_threshold() -> None:
    settle_garbage_collector()
    assert gc.get_threshold() == SERVING_GC_THRESHOLDS
    assert gc.get_freeze_count() > 0


@pytest.mark.usefixtures("restore_gc")
def test_a_reference_cycle_dropped_while_serving_is_still_collected() -> None:
    settle_garbage_collector()
    first, second = Node(), Node()
    first.other, second.other = second, first
    gone = weakref.ref(first)
    del first, second
    assert gone() is not None  # a cycle: reference counting alone cannot free it
    # Enough young allocations that survive, as a server's requests in flight make, to pass the threshold.
    alive = [[] for _ in range(SERVING_GC_THRESHOLDS[0] + 1)]
    assert gone() is None
    del alive
