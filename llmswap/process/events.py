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
