"""Whether holding a loaded model back for its clients pays: its arrival rate loaded versus not loaded.

The batch scheduler lets other models' requests wait (up to `maxWait`) while a loaded model keeps
serving. That only pays when the loaded model's requests come *because* it is loaded: a closed
loop of agents sends its next request a moment after the previous answer, and stops sending while
its model is away. There, every request the loaded model serves in its residency is one that would
otherwise have cost a load of its own, and holding the machine cuts swaps tenfold.

Open-loop traffic is different: requests arrive at the same rate whether their model is loaded or
not, so while a model is away its queue grows by itself and the next load serves all of it at
once. Holding the loaded model back then saves no load — it only leaves the machine idle while
others wait, and FIFO (which swaps as soon as the loaded model has nothing in flight) finishes
sooner with as few swaps.

`ArrivalRates` measures both rates per model: requests per second while it is ready ("present")
and while it is not ("absent"), as exponentially decayed sums of arrivals and seconds over its
periods of presence and absence. `closedness(model)` is 1 - absent/present within [0, 1]: 1 for a
closed loop, 0 for open-loop traffic. The planner scales how long it holds a model (minimum
residency) and how long others are deferred for it (maxWait) by that number (`hold_factor`; under
`HOLD_THRESHOLD`, not at all). Until a model has been away long enough that open-loop traffic would have
sent `MIN_EXPECTED` requests meanwhile, it is
`DEFAULT_CLOSEDNESS`: FIFO's behaviour until holding is measured to pay. One exchange can say more: a client
that only ever sent one request at a time and is back within `QUICK_RETURN` of its answer although its model
was evicted meanwhile (a request caught in that window) is an agent in a closed loop, and so, presumably, are
the clients of the other models: from then on a model not yet measured counts as a closed loop (1), and its
own measurements take over once they can tell. Open-loop traffic sends overlapping requests, which rules its
model out as evidence. A model's presence is
counted a short window past its eviction (a tenth of a load: `RETURN_WINDOW`): a request arriving
that soon is one a hold that short would have served, and without it a scheduler that never holds
would never see the closed loop it could batch.

Pure bookkeeping on the scheduler's clock: no I/O, no timers.
"""

from __future__ import annotations

from dataclasses import dataclass

DECAY = 0.7  # weight kept by the past at the end of each period: a few cycles of history
DEFAULT_CLOSEDNESS = 0.0
RETURN_WINDOW = 0.1  # of the model's load time: how soon after its last answer a return is "caught"
HOLD_THRESHOLD = 0.5  # below this closedness, traffic counts as open loop (Poisson noise alone reaches ~0.3)
MIN_SECONDS = 1e-3
MIN_PERIODS = 1  # of each kind before a rate is trusted
# Open-loop traffic at the loaded rate would have sent this many requests during the absences seen
# before few arrivals then say "closed loop" (P(none | Poisson(2)) = 14 %); until then, the default.
MIN_EXPECTED = 2.0
# A client back this soon after its answer, its model evicted meanwhile, answered at machine speed (an
# agent, a tool loop; a person takes longer): the workload is closed loops, and unmeasured models are
# presumed so (`closedness`).
QUICK_RETURN = 0.25


@dataclass
class _Rate:
    """Decayed arrivals and seconds over finished periods, plus the period in progress."""

    arrivals: float = 0.0
    seconds: float = 0.0
    periods: int = 0  # finished periods
    current: int = 0  # arrivals in the period in progress
    since: float | None = None  # start of the period in progress; None when not in this kind of period

    def close(self, now: float) -> None:
        if self.since is None:
            return
        length = now - self.since
        if length >= MIN_SECONDS:
            self.arrivals = self.arrivals * DECAY + self.current
            self.seconds = self.seconds * DECAY + length
            self.periods += 1
        self.current = 0
        self.since = None

    def seconds_until(self, now: float) -> float:
        """Decayed seconds measured, the period in progress included."""
        return self.seconds + (max(0.0, now - self.since) if self.since is not None else 0.0)

    def rate(self, now: float, *, discount: float = 0.0) -> float | None:
        """Requests per second including the period in progress, `discount` arrivals fewer (never below
        zero); None before `MIN_PERIODS` periods."""
        if self.periods < MIN_PERIODS:
            return None
        arrivals, seconds = self.arrivals, self.seconds
        if self.since is not None and now - self.since >= MIN_SECONDS:  # (a window ahead: negative)
            arrivals += self.current
            seconds += now - self.since
        return max(0.0, arrivals - discount) / seconds if seconds > 0 else None


@dataclass
class _Model:
    present: _Rate
    absent: _Rate
    answered: float | None = None  # when its last request finished
    overlapped: bool = False  # a request arrived while another of it was in flight or waiting


class ArrivalRates:
    """Per model: how fast its requests arrive while it is loaded and while it is not."""

    def __init__(self, *, default_closedness: float = DEFAULT_CLOSEDNESS) -> None:
        self._default = default_closedness
        self._models: dict[str, _Model] = {}
        self._returns_seen = False  # a client came back right after its model was evicted (see `closedness`)

    def _entry(self, model: str) -> _Model:
        entry = self._models.get(model)
        if entry is None:
            entry = self._models[model] = _Model(_Rate(), _Rate())
        return entry

    def loaded(self, model: str, now: float) -> None:
        """`model` became ready: its period of absence (if any) ends, one of presence starts."""
        entry = self._entry(model)
        if entry.present.since is not None:
            return
        entry.absent.close(now)
        entry.present.since = now

    def left(self, model: str, now: float, *, window: float = 0.0) -> None:
        """`model` is being evicted or stopped: its presence ends, its absence starts.

        Its presence is counted `window` seconds longer: a request arriving that soon after (its
        client answering its last response) is one a hold that short would have served while loaded;
        without this a scheduler that never holds would never see the closed loop it could batch.
        """
        entry = self._entry(model)
        if entry.present.since is None:
            return
        entry.present.close(now + window)
        entry.absent.since = now + window

    def answered(self, model: str, now: float) -> None:
        """A request of `model` finished."""
        self._entry(model).answered = now

    def arrived(self, model: str, now: float, *, ready: bool, quiet: bool = True) -> None:
        """A request for `model` arrived; `ready`: its model was loaded and serving; `quiet`: nothing else
        of it was in flight or waiting (a closed-loop client sends one request at a time)."""
        entry = self._entry(model)
        entry.overlapped |= not quiet
        if ready:
            if entry.present.since is None:
                self.loaded(model, now)  # it became ready without a swap we saw (a reload kept it)
            entry.present.current += 1
            return
        if entry.present.since is not None:
            self.left(model, now)  # stopped without an eviction we saw (ttl, unload, crash)
        absent_since = entry.absent.since
        if absent_since is None:
            return
        if now < absent_since:
            entry.present.arrivals += 1  # within the window after it left: counted as present
            if not entry.overlapped and entry.answered is not None and now - entry.answered <= QUICK_RETURN:
                measured = self._measured(entry, now)
                self._returns_seen |= measured is None or measured >= HOLD_THRESHOLD  # not known open loop
        else:
            entry.absent.current += 1

    def hold_factor(self, model: str, now: float) -> float:
        """What share of maxWait and minResidency holding `model` is worth: its closedness, or 0 when
        that is below `HOLD_THRESHOLD` (mostly open-loop traffic: holding saves too little to pay)."""
        closed = self.closedness(model, now)
        return closed if closed >= HOLD_THRESHOLD else 0.0

    def closedness(self, model: str, now: float) -> float:
        """1 when `model`'s clients wait for it (closed loop), 0 when they arrive regardless."""
        entry = self._models.get(model)
        measured = self._measured(entry, now) if entry is not None else None
        if measured is not None:
            return measured
        # Unmeasured: the default, or 1 once a client not known to be open loop was seen coming straight
        # back after its model's eviction (agents in closed loops: their first exchange says so for every
        # model they use, before each model's own absences are measured).
        return 1.0 if self._returns_seen else self._default

    @staticmethod
    def _measured(entry: _Model, now: float) -> float | None:
        """Closedness from the model's own rates, None while they cannot tell yet."""
        # One arrival while loaded may be chance (a short residency makes it look like a high rate).
        present, absent = entry.present.rate(now, discount=0.5), entry.absent.rate(now)
        if present is None or absent is None:
            return None
        if present * entry.absent.seconds_until(now) < MIN_EXPECTED and absent < present:
            return None  # too short an absence to tell a closed loop from a lull
        if present <= 0:
            return 0.0  # nothing comes while it is loaded: holding it serves nobody
        return min(1.0, max(0.0, 1.0 - absent / present))
