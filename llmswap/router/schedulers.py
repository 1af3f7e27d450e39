"""Choosing the scheduling strategy: `routing.scheduler.use` → a `SchedulerFactory` for BaseRouter."""

from __future__ import annotations

import logging

from llmswap.config.model import Config
from llmswap.scheduler.fifo import FifoScheduler
from llmswap.scheduler.types import Clock, Effects, Scheduler, SchedulerFactory, Swapper


def scheduler_factory(config: Config, name: str, swapper: Swapper, clock: Clock) -> SchedulerFactory:
    """The one place where a swapper and a scheduler meet BaseRouter's Effects (seed 001's Factory)."""
    limits = {mid: m.concurrency_limit for mid, m in config.models.items()}
    settings = config.routing.scheduler
    logger = logging.getLogger(f"llmswap.scheduler.{name}")

    def make(effects: Effects) -> Scheduler:
        if settings.use == "fifo":
            return FifoScheduler(name, swapper, effects, limits=limits, priority=settings.priority,
                                 clock=clock, logger=logger)
        raise ValueError(f"routing.scheduler.use: unknown scheduler {settings.use!r}")

    return make
