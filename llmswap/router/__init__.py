"""Routers: process machinery (BaseRouter) plus one eviction policy each; `build_router` picks by config."""

from __future__ import annotations

import time
from collections.abc import Callable

from llmswap.config.model import Config
from llmswap.machine.reader import MemoryReader
from llmswap.router.base import BaseRouter
from llmswap.router.types import (
    AcquireOptions,
    LoadProgress,
    ProcessFactory,
    ProcessLike,
    SwapFinished,
    SwapStarted,
)


def build_router(
    config: Config,
    *,
    process_factory: ProcessFactory | None = None,
    clock: Callable[[], float] = time.monotonic,
    reader: MemoryReader | None = None,
) -> BaseRouter:
    """The router `routing.router.use` names, over every model of `config`.

    `reader` (vram router only) replaces the detected memory reader, e.g. with a FakeReader in tests.
    """
    use = config.routing.router.use
    if use == "group":
        from llmswap.router.group import GroupRouter

        return GroupRouter(config, process_factory=process_factory, clock=clock)
    if use == "matrix":
        from llmswap.router.matrix import MatrixRouter

        return MatrixRouter(config, process_factory=process_factory, clock=clock)
    if use == "vram":
        from llmswap.router.vram import VramRouter

        return VramRouter(config, process_factory=process_factory, clock=clock, reader=reader)
    raise ValueError(f"routing.router.use: unknown router {use!r} (valid: group, matrix, vram)")


__all__ = [
    "AcquireOptions", "BaseRouter", "LoadProgress", "ProcessFactory", "ProcessLike", "SwapFinished",
    "SwapStarted", "build_router",
]
