"""The matrix router: sets of models allowed to run together, cheapest set by eviction cost."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from llmswap.config.model import Config
from llmswap.router.base import BaseRouter
from llmswap.router.schedulers import scheduler_factory
from llmswap.router.types import ProcessFactory
from llmswap.scheduler.swappers.matrix import MatrixSwapper


class MatrixRouter(BaseRouter):
    def __init__(self, config: Config, *, process_factory: ProcessFactory | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        matrix = config.routing.router.matrix
        if matrix is None or matrix.program is None:
            raise ValueError("routing.router.use is 'matrix' but routing.router.settings.matrix is not set")
        swapper = MatrixSwapper(matrix.program, logging.getLogger("llmswap.router.matrix"))
        super().__init__("matrix", config, scheduler_factory(config, "matrix", swapper, clock),
                         process_factory=process_factory, clock=clock)
        self.swapper = swapper
