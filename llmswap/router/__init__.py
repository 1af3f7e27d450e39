"""The router (`Router`, one object whatever its policy) and `build_router`, which picks its policy."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from llmswap.config.model import Config
from llmswap.machine.reader import MemoryReader
from llmswap.router.policy import RouterPolicy
from llmswap.router.router import Router
from llmswap.router.types import (
    AcquireOptions,
    LoadProgress,
    ProcessFactory,
    ProcessLike,
    SwapFinished,
    SwapStarted,
)
from llmswap.scheduler.swappers.group import GroupSwapper
from llmswap.scheduler.swappers.matrix import MatrixSwapper

ROUTERS = ("group", "matrix", "vram")


def policy_for(config: Config, reader: MemoryReader | None = None) -> RouterPolicy:
    """The policy `routing.router.use` names: llama-swap's groups (`group`), sets of models allowed to run
    together, cheapest by eviction cost (`matrix`), or measured footprints against a memory budget (`vram`).

    `reader` (vram only) replaces the detected memory reader, e.g. with a FakeReader in tests.
    """
    use = config.routing.router.use
    if use == "group":
        return RouterPolicy("group", GroupSwapper(config.routing.router.groups))
    if use == "matrix":
        matrix = config.routing.router.matrix
        if matrix is None or matrix.program is None:
            raise ValueError("routing.router.use is 'matrix' but routing.router.settings.matrix is not set")
        swapper = MatrixSwapper(matrix.program, logging.getLogger("llmswap.router.matrix"))
        return RouterPolicy("matrix", swapper)
    if use == "vram":
        from llmswap.router.vram import VramPolicy

        return VramPolicy(config, reader=reader)
    raise ValueError(f"routing.router.use: unknown router {use!r} (valid: {', '.join(ROUTERS)})")


def build_router(
    config: Config,
    *,
    process_factory: ProcessFactory | None = None,
    clock: Callable[[], float] = time.monotonic,
    reader: MemoryReader | None = None,
) -> Router:
    """The router over every model of `config`, with the policy `routing.router.use` names."""
    return Router(config, policy_for(config, reader), process_factory=process_factory, clock=clock)


__all__ = [
    "AcquireOptions", "LoadProgress", "ProcessFactory", "ProcessLike", "Router", "SwapFinished",
    "SwapStarted", "build_router", "policy_for",
]
