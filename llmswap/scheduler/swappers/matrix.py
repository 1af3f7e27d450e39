"""The matrix router's eviction policy: keep the cheapest allowed combination beside the target.

The decision itself lives in the compiled `MatrixProgram` (see `llmswap.config.matrix_dsl`); this adapter
gives it the `Swapper` shape and writes the one log line per committed swap.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from llmswap.config.matrix_dsl import MatrixProgram


class MatrixSwapper:
    def __init__(self, program: MatrixProgram, logger: logging.Logger | None = None) -> None:
        self._program = program
        self._logger = logger or logging.getLogger("llmswap.scheduler.matrix")

    @property
    def program(self) -> MatrixProgram:
        return self._program

    def evictions_for(self, target: str, running: Sequence[str]) -> list[str]:
        return list(self._program.solve(target, running).evict)

    def on_swap_start(self, target: str, running: Sequence[str]) -> None:
        # Re-solved rather than remembered: evictions_for is speculative and may have been asked
        # about many targets since; this is the decision actually committed.
        solution = self._program.solve(target, running)
        self._logger.info(
            "matrix: model=%s set=%s dsl=%s evict=[%s] cost=%d",
            target,
            solution.set_name if solution.set_name is not None else "(none: runs alone)",
            solution.dsl or "-",
            ", ".join(solution.evict),
            solution.cost,
        )
