"""The group router: llama-swap's groups (`swap`, `exclusive`, `persistent`) decide evictions."""

from __future__ import annotations

import time
from collections.abc import Callable

from llmswap.config.model import Config
from llmswap.router.base import BaseRouter
from llmswap.router.schedulers import scheduler_factory
from llmswap.router.types import ProcessFactory
from llmswap.scheduler.swappers.group import GroupSwapper


class GroupRouter(BaseRouter):
    def __init__(self, config: Config, *, process_factory: ProcessFactory | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        swapper = GroupSwapper(config.routing.router.groups)
        super().__init__("group", config, scheduler_factory(config, "group", swapper, clock),
                         process_factory=process_factory, clock=clock)
        self.swapper = swapper
