"""Where a model defined here and on `discover: true` peers (other llmswaps) is served: a pure rule over what
each host says about itself.

A host's view is what its `/api/events` stream told (`peer_watch.py`) or, for this host, its own router: each
model's state, in-flight and waiting counts, and the free memory its vram router reports. In order:

1. where the model is ready with room (nothing of it waiting);
2. else where it loads without evicting a busy model (nothing in flight or waiting on that host);
3. else on the host with the most free memory;

ties, at every step, by most free memory, then fewest requests in flight, then name (this host's name is ""
so that a full tie stays here: no hop for nothing). A peer that is not connected, or silent longer than its
stale bound, is not a candidate; with none left, this host serves. A request another llmswap forwarded
(`FORWARDED_HEADER`) is never forwarded again: one hop at most.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

FORWARDED_HEADER = "X-Llmswap-Forwarded"
LOCAL = ""  # this host's name in a placement


@dataclass(frozen=True)
class ModelView:
    state: str = "stopped"
    in_flight: int = 0
    waiting: int = 0


@dataclass
class HostView:
    name: str
    models: dict[str, ModelView] = field(default_factory=dict)
    free_memory: int | None = None  # bytes, when its router budgets memory
    fresh: bool = True  # connected and heard from within its stale bound

    @property
    def in_flight(self) -> int:
        return sum(m.in_flight for m in self.models.values())

    @property
    def busy(self) -> bool:
        return any(m.in_flight or m.waiting for m in self.models.values())


@dataclass(frozen=True)
class Placement:
    host: str  # LOCAL or a peer's id
    reason: str


def place(model: str, here: HostView, peers: Sequence[HostView]) -> Placement:
    """Where `model` is served (see the module's doc)."""
    stale = [p.name for p in peers if not p.fresh and model in p.models]
    candidates = [here] + [p for p in peers if p.fresh and model in p.models]
    order = sorted(candidates, key=lambda h: (-(h.free_memory or 0), h.in_flight, h.name))
    skipped = f"; {', '.join(stale)} down or stale" if stale else ""
    ready = [h for h in order if _ready_with_room(h.models.get(model))]
    if ready:
        return Placement(ready[0].name, f"ready with room on {_shown(ready[0].name)}{skipped}")
    idle = [h for h in order if not h.busy]
    if idle:
        return Placement(idle[0].name, f"loads on {_shown(idle[0].name)} evicting nothing busy{skipped}")
    return Placement(order[0].name, f"most free memory on {_shown(order[0].name)}{skipped}")


def _ready_with_room(view: ModelView | None) -> bool:
    return view is not None and view.state == "ready" and view.waiting == 0


def _shown(name: str) -> str:
    return "this host" if name == LOCAL else name


def local_view(states: Mapping[str, str], in_flight: Mapping[str, int], waiting: Mapping[str, int],
               free_memory: int | None) -> HostView:
    """This host's view, from its router's states and queue counts."""
    models = {m: ModelView(state, in_flight.get(m, 0), waiting.get(m, 0)) for m, state in states.items()}
    return HostView(LOCAL, models, free_memory)
