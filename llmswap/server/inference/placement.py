"""Where a model defined here and on `discover: true` peers (other llmswaps) is served: a pure rule over what
each host says about itself.

A host's view is what its `/api/events` stream told (`peer_watch.py`) or, for this host, its own router: each
model's state, in-flight and waiting counts, and the free memory its vram router reports. In order:

1. where the model is ready with room (nothing of it waiting): this host when it is one of them (a
   loaded model is never worth a hop), else the peer with the fewest requests in flight;
2. else where it loads without evicting a busy model (nothing in flight or waiting on that host): this
   host when it is one, else the peer with the most free memory;
3. else the host with the most free memory, then the fewest in flight.

Free memory breaks a tie only between hosts that both report it: a host without a vram router does not know
its free memory, and that is not zero (it neither wins nor loses on memory). The last tie-break is the name,
this host's being "" so that a full tie stays here: no hop for nothing. A peer that is not connected, or
silent longer than its stale bound, is not a candidate; with none left, this host serves. A request another
llmswap forwarded (`FORWARDED_HEADER`) is never forwarded again: one hop at most.
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
    listed: bool = True  # false for a model its host keeps out of /v1/models (`unlisted`)


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
    skipped = f"; {', '.join(stale)} down or stale" if stale else ""
    ready = [h for h in candidates if _ready_with_room(h.models.get(model))]
    if ready:
        chosen = here if here in ready else min(ready, key=lambda h: (h.in_flight, h.name))
        return Placement(chosen.name, f"ready with room on {_shown(chosen.name)}{skipped}")
    idle = [h for h in candidates if not h.busy]
    if idle:
        chosen = here if here in idle else _roomiest(idle)
        return Placement(chosen.name, f"loads on {_shown(chosen.name)} evicting nothing busy{skipped}")
    chosen = _roomiest(candidates)
    return Placement(chosen.name, f"most free memory on {_shown(chosen.name)}{skipped}")


def place_remote(model: str, peers: Sequence[HostView]) -> Placement | None:
    """Where a model this host does not define is served: the same rules among the fresh peers that define
    it (None when none does)."""
    candidates = [p for p in peers if p.fresh and model in p.models]
    if not candidates:
        return None
    ready = [h for h in candidates if _ready_with_room(h.models.get(model))]
    if ready:
        chosen = min(ready, key=lambda h: (h.in_flight, h.name))
        return Placement(chosen.name, f"ready with room on {chosen.name}")
    idle = [h for h in candidates if not h.busy]
    chosen = _roomiest(idle or candidates)
    return Placement(chosen.name, f"{'loads on' if idle else 'most free memory on'} {chosen.name}"
                                  f"{' evicting nothing busy' if idle else ''}")


def _roomiest(hosts: Sequence[HostView]) -> HostView:
    """The host with the most free memory when every one of `hosts` reports it (else memory says nothing),
    then the fewest requests in flight, then the name."""
    known = all(h.free_memory is not None for h in hosts)
    return min(hosts, key=lambda h: (-(h.free_memory or 0) if known else 0, h.in_flight, h.name))


def _ready_with_room(view: ModelView | None) -> bool:
    return view is not None and view.state == "ready" and view.waiting == 0


def _shown(name: str) -> str:
    return "this host" if name == LOCAL else name


def local_view(states: Mapping[str, str], in_flight: Mapping[str, int], waiting: Mapping[str, int],
               free_memory: int | None) -> HostView:
    """This host's view, from its router's states and queue counts."""
    models = {m: ModelView(state, in_flight.get(m, 0), waiting.get(m, 0)) for m, state in states.items()}
    return HostView(LOCAL, models, free_memory)
