"""Whether a set of models may run at once under an eviction policy: a pure question to a `Swapper`."""

from __future__ import annotations

from collections.abc import Collection

from llmswap.scheduler.errors import SchedulerError
from llmswap.scheduler.types import Swapper


def fit_together(swapper: Swapper, models: Collection[str]) -> bool:
    """True when none of `models` would evict another of them (a model that can never run: False)."""
    wanted = sorted(set(models))
    try:
        return all(
            not set(swapper.evictions_for(model, [o for o in wanted if o != model])) & set(wanted)
            for model in wanted
        )
    except SchedulerError:
        return False
