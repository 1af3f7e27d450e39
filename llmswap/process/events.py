"""What a `Process` tells its owner: one typed `ProcessEvent` per step of its life.

The router decides on `kind` and `cause`, never on `detail`, which is text for people (logs, the UI).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from llmswap.kvcache.keeper import KvReport

EventKind = Literal["starting", "ready", "start_failed", "stopping", "stopped", "exited", "ttl_expired", "kv",
                    "slept", "woke"]


class StopCause(enum.Enum):
    """Why a run is stopping or stopped (the `cause` of `stopping` and `stopped` events)."""

    REQUESTED = "stop requested"  # stop(): an eviction, an unload, a swap's abort
    SHUTDOWN = "shutdown"
    TTL = "ttl expired"  # idle for the model's ttl: nobody asked, the scheduler must be told
    START_ABORTED = "start aborted"
    INTERNAL = "internal error"  # the supervisor itself failed or was cancelled


@dataclass(frozen=True)
class LifeTimes:
    """Seconds one life of a process spent in each phase its owner waits through (None: not done in it):
    what `Process.ensure_ready` and `Process.stop` answer, so the router can time a swap phase by phase."""

    start: float | None = None  # spawn to healthy: reading the weights, above all
    restore: float | None = None  # the saved KV slots back, before the first request
    wake: float | None = None  # a sleeping server woken instead of a start
    save: float | None = None  # the KV slots saved, before the stop signal
    stop: float | None = None  # the stop signal to the child's exit


@dataclass(frozen=True)
class ProcessEvent:
    model: str
    kind: EventKind
    exit_code: int | None = None  # negative: killed by that signal
    detail: str = ""
    duration: float | None = None  # for "ready": seconds from spawn to ready; "slept", "woke": the call's
    cause: StopCause | None = None  # for "stopping" and "stopped"
    kv: KvReport | None = None  # for "kv": its slots saved (during a stop) or restored (during a start)

    @property
    def stopped_by_itself(self) -> bool:
        """Whether the process went away without the router asking: it exited, or its ttl ran out."""
        return self.kind == "exited" or (self.kind == "stopped" and self.cause is StopCause.TTL)
