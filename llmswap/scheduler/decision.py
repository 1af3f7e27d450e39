"""What the scheduler makes of a request, as data: where it goes (`Decision`), and the swaps it may join.

`Books.decide` returns a `Decision` and `Books.apply` carries it out, whatever it is. A policy expresses
when a swap may start as a `StopRule` (why a victim may not be stopped now) that `decide` applies: a SWAP
decided under the policy's rule starts now. Kept apart from the books so that the decision reads as the
small value it is.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from llmswap.scheduler.errors import SchedulerError
from llmswap.scheduler.types import HandlerRequest


class Place(enum.Enum):
    """Where a request goes, as `Books.decide` sees it now."""

    SERVE = "serve"  # its model is ready, free to take it, nothing to evict
    JOIN = "join"  # a swap to its model is loading: it waits for that one
    SWAP = "swap"  # its model is to be started (evicting `Decision.evict`): now, under the policy's StopRule
    WAIT = "wait"  # something in its way must end first (`Decision.why`)
    FAIL = "fail"  # it can never be served here (`Decision.error`)


# A policy's rule for a swap's victims: why `model` may not be stopped now (the swap waits), or None.
StopRule = Callable[[str], str | None]


@dataclass(frozen=True)
class Decision:
    """What `decide` makes of a request: pure data, carried out by `apply`."""

    place: Place
    evict: tuple[str, ...] = ()  # SWAP (and a WAIT for its victims): what starting its model stops
    running: tuple[str, ...] = ()  # SWAP: the running set the swapper saw
    swap: ActiveSwap | None = None  # JOIN: the swap it joins
    error: SchedulerError | None = None  # FAIL
    why: str = ""  # WAIT, for the debug log


@dataclass
class ActiveSwap:
    """A swap on the books, from its start to its `SwapDone`, and the requests waiting for it."""

    model: str
    evict: tuple[str, ...]
    started: float
    waiters: list[HandlerRequest] = field(default_factory=list)
    # Set once nobody may join any more (aborted, or its model unloaded); its SwapDone only cleans up.
    detached: Literal["aborted", "unloaded"] | None = None

    def collides(self, target: str, evict: Sequence[str]) -> bool:
        """Whether a swap to `target` evicting `evict` would interfere with this one."""
        return self.model in evict or target in self.evict or not set(self.evict).isdisjoint(evict)
