"""`QueueSettings`: what a queueing scheduler is told by its config, as one typed value.

Built once from `routing.scheduler` and the models' and keys' limits (`QueueSettings.of`), and handed as
it is to the scheduler and its books; the batch scheduler adds its `BatchSettings`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from llmswap.config.model import EMPTY, AdmissionConfig, Config
from llmswap.scheduler.prioritizers import Prioritizer


def _none() -> Mapping[str, int]:
    return EMPTY


@dataclass(frozen=True)
class QueueSettings:
    limits: Mapping[str, int] = field(default_factory=_none)  # each model's concurrencyLimit
    priority: Mapping[str, int] = field(default_factory=_none)  # each model's priority (fifo's or batch's)
    admission: AdmissionConfig | None = None  # bounds on waiting requests
    key_limits: Mapping[str, int] = field(default_factory=_none)  # each API key's maxConcurrent
    prioritizer: Prioritizer = field(default_factory=Prioritizer)  # the order within a priority class
    on_deadline: str = "ignore"  # what a request past its deadline gets
    preempt_below: int | None = None  # in-flight requests below this priority may be preempted

    @classmethod
    def of(cls, config: Config) -> QueueSettings:
        scheduler = config.routing.scheduler
        priority = scheduler.batch.priority if scheduler.use == "batch" else scheduler.priority
        return cls(
            limits={mid: m.concurrency_limit for mid, m in config.models.items()},
            priority=priority,
            admission=scheduler.admission,
            key_limits={k.key: k.max_concurrent for k in config.api_keys if k.max_concurrent > 0},
            prioritizer=Prioritizer(scheduler.prioritizer),
            on_deadline=scheduler.on_deadline,
            preempt_below=scheduler.preempt_below,
        )


DEFAULT_SETTINGS = QueueSettings()
