"""What the schedulers have measured about each model: how long a request is served, how long a load takes.

Both are smoothed with an exponentially weighted moving average together with its mean absolute
deviation (the way TCP smooths round-trip times), so one slow request moves the estimate without
taking it over. Service time is measured from `grant_serve` to `ServeDone` on the scheduler's own
clock; load time is `SwapDone.duration` of successful swaps. A model not observed yet is assumed
to behave like the average of the models that were (same machine, similar servers); before any
observation at all the defaults stand in: a 1 s service time reproduces llama-swap's constant
`Retry-After: 1` until there is something better to say.

How fast a queue drains is a third measure: the gaps between a model's completions while it is busy
(the first gap counted from when it became busy). An upstream serving one request at a time completes
one per service time; one serving four in parallel, about four per service time. Little's law puts it the
same way: throughput is requests in flight over the time each spends. The mean gap over the last
`GAP_WINDOW` completions is what each queued request ahead costs a newcomer.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_SERVICE_TIME = 1.0  # seconds per request before any ServeDone of that model was seen
DEFAULT_LOAD_TIME = 5.0  # seconds per load before any successful swap of that model was seen
SMOOTHING = 0.3  # weight of the newest sample
GAP_WINDOW = 32  # completions whose gaps make a model's drain rate: a few batches' worth of parallel ones
DEVIATIONS = 4.0  # mean deviations a cautious ("upper") estimate adds, as TCP's retransmission timeout does


@dataclass
class Smoothed:
    """One moving average with its mean absolute deviation."""

    mean: float
    deviation: float
    samples: int = 0

    def add(self, value: float) -> None:
        if self.samples == 0:
            self.mean, self.deviation = value, value / 2
        else:
            error = value - self.mean
            self.mean += SMOOTHING * error
            self.deviation += SMOOTHING * (abs(error) - self.deviation)
        self.samples += 1

    @property
    def upper(self) -> float:
        return self.mean + DEVIATIONS * self.deviation


class ServiceTimes:
    """Per-model service and load time estimates, fed by the scheduler's events."""

    def __init__(
        self, *, default_service: float = DEFAULT_SERVICE_TIME, default_load: float = DEFAULT_LOAD_TIME
    ) -> None:
        self._default_service = default_service
        self._default_load = default_load
        self._service: dict[str, Smoothed] = {}
        self._load: dict[str, Smoothed] = {}
        self._gaps: dict[str, deque[float]] = {}

    def observe_service(self, model: str, seconds: float) -> None:
        self._entry(self._service, model, self._default_service).add(max(0.0, seconds))

    def observe_load(self, model: str, seconds: float) -> None:
        self._entry(self._load, model, self._default_load).add(max(0.0, seconds))

    def observe_gap(self, model: str, seconds: float) -> None:
        """A completion of `model`, `seconds` after its previous one (or after it became busy)."""
        gaps = self._gaps.get(model)
        if gaps is None:
            gaps = self._gaps[model] = deque(maxlen=GAP_WINDOW)
        gaps.append(max(0.0, seconds))

    def per_request(self, model: str) -> float:
        """The expected seconds one queued request of `model` holds up those behind it: its mean gap
        between completions once some were seen, until then its service time."""
        gaps = self._gaps.get(model)
        if gaps:
            return sum(gaps) / len(gaps)
        return self.service(model)

    def service(self, model: str) -> float:
        """The expected seconds one request of `model` is served."""
        return _lookup(self._service, model, self._default_service).mean

    def service_upper(self, model: str) -> float:
        """A cautious bound on one request's service time: what a planner should leave room for."""
        return _lookup(self._service, model, self._default_service).upper

    def load(self, model: str) -> float:
        """The expected seconds a swap to `model` takes (its evictions included)."""
        return _lookup(self._load, model, self._default_load).mean

    def adopt(self, other: ServiceTimes, models: Iterable[str]) -> None:
        """Take `other`'s estimates for `models` (a reload's unchanged models: same server, same times)."""
        for model in models:
            for mine, theirs in ((self._service, other._service), (self._load, other._load)):
                entry = theirs.get(model)
                if entry is not None:
                    mine[model] = dataclasses.replace(entry)
            if model in other._gaps:
                self._gaps[model] = deque(other._gaps[model], maxlen=GAP_WINDOW)

    def observed(self, model: str) -> tuple[int, int]:
        """(service samples, load samples) seen for `model`: for logs and tests."""
        service, load = self._service.get(model), self._load.get(model)
        return (service.samples if service else 0, load.samples if load else 0)

    @staticmethod
    def _entry(table: dict[str, Smoothed], model: str, default: float) -> Smoothed:
        entry = table.get(model)
        if entry is None:
            entry = table[model] = Smoothed(default, default / 2)
        return entry


def _lookup(table: dict[str, Smoothed], model: str, default: float) -> Smoothed:
    entry = table.get(model)
    if entry is not None:
        return entry
    if table:
        mean = sum(e.mean for e in table.values()) / len(table)
        deviation = sum(e.deviation for e in table.values()) / len(table)
        return Smoothed(mean, deviation)
    return Smoothed(default, default / 2)


def retry_after(seconds: float) -> float:
    """A `Retry-After` value: whole seconds, rounded up, at least 1."""
    if not math.isfinite(seconds):
        return 1.0
    return float(max(1, math.ceil(seconds - 1e-9)))
