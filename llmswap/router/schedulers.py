"""Choosing the scheduling strategy: `routing.scheduler.use` → a `SchedulerFactory` for BaseRouter.

Both schedulers get each model's `concurrencyLimit`, the API keys' `maxConcurrent` and
`routing.scheduler.admission`. FIFO orders by `settings.fifo.priority`; batch by
`settings.batch.priority` with its `maxWait` and `minResidency`.
"""

from __future__ import annotations

import logging

from llmswap.config.model import Config
from llmswap.scheduler.batch import BatchScheduler
from llmswap.scheduler.fifo import FifoScheduler
from llmswap.scheduler.prioritizers import Prioritizer
from llmswap.scheduler.types import Clock, Effects, Scheduler, SchedulerFactory, Swapper

SCHEDULERS = ("fifo", "batch")


def scheduler_factory(config: Config, name: str, swapper: Swapper, clock: Clock) -> SchedulerFactory:
    """The one place where a swapper and a scheduler meet BaseRouter's Effects (seed 001's Factory)."""
    limits = {mid: m.concurrency_limit for mid, m in config.models.items()}
    key_limits = {k.key: k.max_concurrent for k in config.api_keys if k.max_concurrent > 0}
    settings = config.routing.scheduler
    if settings.use not in SCHEDULERS:
        raise ValueError(f"routing.scheduler.use: unknown scheduler {settings.use!r}; use one of "
                         f"{', '.join(SCHEDULERS)}")
    logger = logging.getLogger(f"llmswap.scheduler.{name}")

    prioritizer = Prioritizer(settings.prioritizer)

    def make(effects: Effects) -> Scheduler:
        if settings.use == "batch":
            return BatchScheduler(name, swapper, effects, limits=limits, settings=settings.batch, clock=clock,
                                  logger=logger, admission=settings.admission, key_limits=key_limits,
                                  prioritizer=prioritizer, on_deadline=settings.on_deadline,
                                  preempt_below=settings.preempt_below)
        return FifoScheduler(name, swapper, effects, limits=limits, priority=settings.priority, clock=clock,
                             logger=logger, admission=settings.admission, key_limits=key_limits,
                             prioritizer=prioritizer, on_deadline=settings.on_deadline,
                             preempt_below=settings.preempt_below)

    return make
