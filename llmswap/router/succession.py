"""A router's place in a chain of config reloads, held in one object: `Succession`.

A reload retires a router in favour of a successor (`llmswap.router.handover.Handover` links the two).
The router asks its `incoming` handover (the predecessor still winding down) before it starts or evicts a
process and when it reads a process's state or in-flight count; a retired router sends its work to the
successor through its `outgoing` handover. The router holds this object and reads it; only the handover
writes it, through `link` and `unlink`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from llmswap.process.events import ProcessEvent
from llmswap.process.state import ProcessState
from llmswap.router.types import NO_OPTIONS, AcquireOptions, Grant, ProcessLike
from llmswap.scheduler.types import ModelLoad


class SuccessorRouter(Protocol):
    """What a retired router hands its work to."""

    def acquire(
        self, model: str, options: AcquireOptions = NO_OPTIONS,
    ) -> contextlib.AbstractAsyncContextManager[ProcessLike]: ...
    async def grant(self, model: str, options: AcquireOptions = NO_OPTIONS) -> Grant: ...
    def load_of(self, model: str) -> ModelLoad | None: ...
    async def unload(self, models: Iterable[str] | None = None, timeout: float | None = None) -> None: ...
    def on_process_event(self, event: ProcessEvent) -> None: ...


class Outgoing(Protocol):
    """The handover that retired a router, as that router sees it."""

    adopted: frozenset[str]  # the processes the successor took over

    @property
    def successor(self) -> SuccessorRouter: ...
    def changed(self) -> None: ...


class IncomingHandover(Protocol):
    """The handover a router took over from, as that router sees it."""

    def claim(self, model: str) -> ProcessState | None: ...
    def serving(self, model: str) -> int: ...
    def inherited_in_flight(self, model: str) -> int: ...
    async def before_start(self) -> None: ...
    async def before_evict(self, model: str) -> None: ...
    async def shut_down_predecessors(self, timeout: float | None) -> None: ...
    async def wait_done(self, timeout: float | None = None) -> None: ...


@dataclass
class Succession:
    """The handovers one router is part of: the one it took over from, the one that retired it."""

    incoming: IncomingHandover | None = None
    outgoing: Outgoing | None = None

    def link(self, *, incoming: IncomingHandover | None = None, outgoing: Outgoing | None = None) -> None:
        if outgoing is not None:
            if self.outgoing is not None:
                raise RuntimeError("this router was already handed over")
            self.outgoing = outgoing
        if incoming is not None:
            self.incoming = incoming

    def unlink(self, incoming: IncomingHandover) -> None:
        """The predecessor behind `incoming` has finished: forget it."""
        if self.incoming is incoming:
            self.incoming = None

    @property
    def retired(self) -> bool:
        return self.outgoing is not None

    @property
    def handed_away(self) -> frozenset[str]:
        """Processes a successor adopted: no longer this router's to stop."""
        return self.outgoing.adopted if self.outgoing is not None else frozenset()

    def progress(self) -> None:
        """Something a successor may wait on moved here (a swap, the end of a request)."""
        if self.outgoing is not None:
            self.outgoing.changed()

    def visible_state(self, model: str, state: ProcessState) -> ProcessState:
        # An adopted process that a predecessor is still starting or stopping is in that state for
        # this router too, even before the predecessor's swap has touched it.
        if self.incoming is not None:
            claimed = self.incoming.claim(model)
            if claimed is not None:
                return claimed
        return state

    def inherited_in_flight(self, model: str) -> int:
        return self.incoming.inherited_in_flight(model) if self.incoming is not None else 0

    async def before_start(self) -> None:
        if self.incoming is not None:
            await self.incoming.before_start()

    async def before_evict(self, model: str) -> None:
        if self.incoming is not None:
            await self.incoming.before_evict(model)
