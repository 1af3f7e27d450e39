"""When a loaded model counts as idle: its clients have stopped coming back, not merely paused.

Agents work in closed loops: send a request, wait for the answer, think for a moment, send the
next. Between two requests of such a client its model has nothing in flight and nothing queued,
for the length of the client's think time. If that already counted as idle, a model with a
steady client would be given away after every request and batching would degenerate into FIFO.

So a model is *idle* when nothing is in flight for it, nothing waits for it, and no request of it
finished within its idle grace. The grace is learned from the model's own clients: whenever a
request arrives while the model has nothing in flight or waiting, the time since its last
finished request is one observed gap; the grace is `GRACE_FACTOR` times their moving average,
kept within [`GRACE_MIN`, `GRACE_MAX`]. Gaps longer than `GRACE_MAX` are not think time (the
client went away and came back) and are not learned from. Before any gap was seen the grace is
`GRACE_DEFAULT`. A model that never finished a request since it was loaded is idle as soon as
nothing is in flight or waiting (its waiters left).

The same observations say whether a model's clients tend to come back at all (`returning`): a
quiet arrival within `GRACE_MAX` of the last finished request is a return, a later one a client
that had gone. The planner uses it to guess how long a model will hold the machine once loaded.
"""

from __future__ import annotations

from llmswap.scheduler.estimates import Smoothed

GRACE_MIN = 0.25  # seconds: below this, network jitter alone would make a busy client look gone
GRACE_MAX = 3.0  # seconds: a waiting model is never held back longer for a client that may not return
GRACE_DEFAULT = 0.5  # seconds, until a gap of this model's clients has been observed
GRACE_FACTOR = 3.0


class ClientGaps:
    """Per model: when its last request finished and how long its clients pause between requests."""

    def __init__(self) -> None:
        self._last_finish: dict[str, float] = {}
        self._gaps: dict[str, Smoothed] = {}
        self._returns: dict[str, Smoothed] = {}  # 1 per return, 0 per departure

    def finished(self, model: str, now: float) -> None:
        self._last_finish[model] = now

    def arrived(self, model: str, now: float, *, quiet: bool) -> None:
        """A request for `model` arrived; `quiet`: nothing of it was in flight or waiting."""
        last = self._last_finish.get(model)
        if not quiet or last is None:
            return
        gap = now - last
        returned = 0 <= gap <= GRACE_MAX
        if returned:
            self._gaps.setdefault(model, Smoothed(gap, 0.0)).add(gap)
        self._returns.setdefault(model, Smoothed(1.0, 0.0)).add(1.0 if returned else 0.0)

    def returning(self, model: str) -> float:
        """How likely a client of `model` is to send another request soon (1 until seen otherwise)."""
        entry = self._returns.get(model)
        return 1.0 if entry is None else entry.mean

    def grace(self, model: str) -> float:
        entry = self._gaps.get(model)
        if entry is None:
            return GRACE_DEFAULT
        return min(GRACE_MAX, max(GRACE_MIN, GRACE_FACTOR * entry.mean))

    def quiet_from(self, model: str) -> float | None:
        """When `model`'s grace after its last finished request ends; None if none finished yet."""
        last = self._last_finish.get(model)
        return None if last is None else last + self.grace(model)

    def last_finish(self, model: str) -> float | None:
        return self._last_finish.get(model)
