"""When a ready model has been idle for its `ttl` and is due for unloading.

Pure bookkeeping, no clock of its own: the process feeds it times and asks for the deadline, then arms one
timer for exactly that instant (re-armed whenever a request starts or ends) instead of ticking every second.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class IdleTimer:
    ttl: float  # seconds; 0 = never unload
    in_flight: int = 0
    idle_since: float = 0.0  # the later of: the last ready transition, the end of the last request

    def became_ready(self, now: float) -> None:
        # Counting from the ready moment too means a model nobody uses after a start is still unloaded,
        # where llama-swap would keep it (or drop it at once, depending on a stale last-use time).
        self.idle_since = max(self.idle_since, now)

    def request_started(self) -> None:
        self.in_flight += 1

    def request_finished(self, now: float) -> None:
        self.in_flight = max(0, self.in_flight - 1)
        self.idle_since = max(self.idle_since, now)

    def deadline(self) -> float | None:
        """The instant the model expires, or None while it must stay (no ttl, or a request in flight)."""
        if self.ttl <= 0 or self.in_flight > 0:
            return None
        return self.idle_since + self.ttl

    def expired(self, now: float) -> bool:
        deadline = self.deadline()
        return deadline is not None and now >= deadline
