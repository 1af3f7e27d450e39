"""The watchdog of one upstream answer: a wall timeout for the whole answer, an idle timeout between bytes.

A stuck upstream (a generation loop that never ends, a server that stops sending mid-answer) would
otherwise hold its model's slot for as long as the client waits (OC-CORE-1022, seed 003). Per model,
`timeouts.wall` bounds the whole answer from the moment its model was granted (headers included)
and `timeouts.idle` the time without a byte from the upstream; 0 = no limit (the default). When one
runs out the upstream request is closed (which aborts it), the client gets a clean error — 504 in
the error envelope before any byte, an error event at the end of an event stream, a cut connection
for any other body (never a truncated answer passed off as complete) — and the request ends, which
frees its slot for the next one.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from llmswap.config.model import Timeouts

T = TypeVar("T")


class WatchdogExpired(TimeoutError):
    """The answer ran past the model's wall or idle timeout."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class Watchdog:
    where: str  # the config path of the timeouts, for messages: "models.qwen.timeouts"
    wall: float = 0.0  # seconds for the whole answer, 0 = no limit
    idle: float = 0.0  # seconds without a byte from the upstream, 0 = no limit
    started: float = field(default_factory=time.monotonic)

    @property
    def active(self) -> bool:
        return self.wall > 0 or self.idle > 0

    @classmethod
    def of(cls, where: str, timeouts: Timeouts) -> Watchdog | None:
        """A watchdog for `timeouts` (started now), or None when neither bound is set."""
        return cls(where, timeouts.wall, timeouts.idle) if timeouts.wall > 0 or timeouts.idle > 0 else None

    async def guard(self, work: Awaitable[T]) -> T:
        """Await `work` (a read, or waiting for headers) within what the timeouts leave."""
        if not self.active:
            return await work
        wall_left = self.started + self.wall - time.monotonic() if self.wall > 0 else math.inf
        idle = self.idle if self.idle > 0 else math.inf
        budget = max(0.0, min(wall_left, idle))
        try:
            async with asyncio.timeout(budget):
                return await work
        except TimeoutError:
            if wall_left <= idle:
                raise WatchdogExpired(
                    f"the upstream's answer took longer than {self.wall:g}s "
                    f"({self.where}.wall); it was stopped") from None
            raise WatchdogExpired(
                f"the upstream sent nothing for {self.idle:g}s ({self.where}.idle); "
                f"it was stopped") from None
