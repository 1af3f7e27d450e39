"""Choosing the scheduling strategy: `routing.scheduler.use` → a `SchedulerFactory` for the router.

Both schedulers get each model's `concurrencyLimit`, the API keys' `maxConcurrent` and
`routing.scheduler.admission`. FIFO orders by `settings.fifo.priority`; batch by
`settings.batch.priority` with its `maxWait` and `minResidency`.
"""

from __future__ import annotations

import logging

from llmswap.config.model import Config
from llmswap.scheduler.batch import BatchScheduler
from llmswap.scheduler.fifo import FifoScheduler
from llmswap.scheduler.settings import QueueSettings
from llmswap.scheduler.types import Clock, Effects, Scheduler, SchedulerFactory, Swapper

SCHEDULERS = ("fifo", "batch")


def scheduler_factory(config: Config, name: str, swapper: Swapper, clock: Clock) -> SchedulerFactory:
    """The one place where a swapper and a scheduler meet the router's Effects (seed 001's Factory)."""
    use = config.routing.scheduler.use
    if use not in SCHEDULERS:
        raise ValueError(f"routing.scheduler.use: unknown scheduler {use!r}; use one of "
                         f"{', '.join(SCHEDULERS)}")
    settings = QueueSettings.of(config)
    logger = logging.getLogger(f"llmswap.scheduler.{name}")

    def make(effects: Effects) -> Scheduler:
        if use == "batch":
            return BatchScheduler(name, swapper, effects, clock=clock, settings=settings,
                                  batch=config.routing.scheduler.batch, logger=logger)
        return FifoScheduler(name, swapper, effects, clock=clock, settings=settings, logger=logger)

    return make
