"""A router's policy (`RouterPolicy`): its swapper (who is evicted for whom) and what it adds to a swap.

The router is one object whatever its policy; what differs between `group`, `matrix` and `vram` is given to
it here. The plain policy adds nothing; the vram policy (`llmswap.router.vram`) waits for freed memory,
recovers from out-of-memory starts, learns footprints and reports the budget.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from llmswap.machine.reader import MemoryReader
from llmswap.process.events import LifeTimes, ProcessEvent
from llmswap.process.state import ProcessState
from llmswap.router.types import ProcessLike, RouterStats
from llmswap.scheduler.types import Swapper, SwapPlan


@dataclass(frozen=True)
class RouterParts:
    """What a policy may read of its router (given once the router is built: `RouterPolicy.bind`)."""

    processes: Mapping[str, ProcessLike]
    stats: RouterStats
    clock: Callable[[], float]
    # Whether a model is busy: a request of it in flight here or at a reload's predecessor, or a swap to it.
    busy: Callable[[str], bool]


class RouterPolicy:
    """The plain policy (group and matrix routers): the swapper decides, nothing is added to a swap."""

    # Whether `state_of`, `adjust_running` and `granted` do anything: the plain policy's do not, and the
    # router skips them on a warm request's path. Derived: True for a policy that overrides any of them.
    adjusts = False
    _HOOKS = ("state_of", "adjust_running", "granted")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.adjusts = any(getattr(cls, hook) is not getattr(RouterPolicy, hook)
                          for hook in RouterPolicy._HOOKS)

    def __init__(self, name: str, swapper: Swapper) -> None:
        self.name = name
        self.swapper = swapper
        self._parts: RouterParts | None = None

    def bind(self, parts: RouterParts) -> None:
        self._parts = parts

    @property
    def parts(self) -> RouterParts:
        if self._parts is None:
            raise RuntimeError(f"the {self.name} policy is not bound to a router yet")
        return self._parts

    def begin(self) -> None:
        """The router's run loop starts (on the event loop)."""

    async def end(self) -> None:
        """The router has shut down: release what the policy holds."""

    def state_of(self, model: str, state: ProcessState) -> ProcessState:
        """The state the scheduler sees of `model`, whose process reports `state`."""
        return state

    def adjust_running(self, running: dict[str, ProcessState]) -> dict[str, ProcessState]:
        """The running models the scheduler sees, from those the processes report."""
        return running

    def granted(self, model: str) -> None:
        """A request of `model` was granted."""

    def process_event(self, event: ProcessEvent) -> None:
        """What one of the router's own processes reported."""

    async def after_evictions(self, plan: SwapPlan) -> None:
        """Between stopping a swap's victims and starting its target."""

    async def bring_up(self, process: ProcessLike) -> LifeTimes | None:
        """Start (or wake) a swap's target; what it took."""
        return await process.ensure_ready()

    @property
    def memory_reader(self) -> MemoryReader | None:
        """The device memory reader the policy decides from (vram), None when it reads none."""
        return None

    def model_extras(self, model: str) -> dict[str, Any]:
        """Facts about a model for /running and /v1/models (vram: its footprint)."""
        return {}

    def router_extras(self) -> dict[str, Any]:
        """Facts for /running (vram: the budget in use)."""
        return {}
