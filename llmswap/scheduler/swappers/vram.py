"""The vram router's eviction policy: evict the cheapest set of running models that makes room.

Each model's footprint comes from the `FootprintBook` (declared, or learned if larger), split per
device. A target fits when, on every device it uses, the running models that stay plus the target
stay within that device's budget. Among the sets of running models whose eviction makes it fit, the
swapper picks the one with the lowest summed cost, where a model's cost is its `evict_costs` entry,
else its last measured load time (reloading a 60 s vLLM model later costs more than a 2 s embedder),
else `DEFAULT_EVICT_COST`. Equal costs go to the set that evicts the least recently used models,
then to model ids, so the answer is deterministic. Persistent models are never evicted.

A target with no declared or learned footprint is sized at its devices' whole budget by the book;
here that means "everything but the persistent models must go", so such a model can always run once
and be measured instead of being refused for the persistent models' share.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from llmswap.config.model import EMPTY, ModelConfig, VramSettings
from llmswap.machine.footprints import FootprintBook
from llmswap.machine.reader import DeviceMemory
from llmswap.machine.units import format_bytes
from llmswap.scheduler.errors import CannotFit

# The cost of evicting a running model whose load was never timed. Timings are recorded on every
# start and persisted, so this only applies to a model started outside the book's view; one second
# is below any real model load, which makes such a model the first candidate, and it is never zero,
# so evicting it is never free.
DEFAULT_EVICT_COST = 1.0

# Up to this many candidates the search is exact (branch and bound over subsets, at worst 4096
# leaves); beyond it a greedy choice by cost per useful byte is used, which is fast but may miss
# the cheapest set.
MAX_EXACT_CANDIDATES = 12

# Costs are compared in whole microseconds so that sums are exact and ties are real ties.
_COST_UNIT = 1_000_000


@dataclass(frozen=True)
class Eviction:
    model: str
    footprint: Mapping[int, int]  # device -> bytes freed by stopping it
    cost: float  # seconds


@dataclass(frozen=True)
class VramPlan:
    """One decision with its numbers: what `evictions_for` returns and what `on_swap_start` logs."""

    target: str
    need: Mapping[int, int]  # device -> bytes the target takes
    evict: tuple[Eviction, ...]  # least recently used first
    free_after: Mapping[int, int]  # device -> budget left once the evictions are done and the target runs
    exact: bool = True  # False when the greedy fallback chose

    @property
    def cost(self) -> float:
        return sum(e.cost for e in self.evict)


def device_budgets(settings: VramSettings, devices: Sequence[DeviceMemory]) -> dict[int, int]:
    """`settings.budget` on every device when given, else each device's total minus `settings.reserve`."""
    if settings.budget is not None:
        return {d.index: settings.budget for d in devices}
    return {d.index: max(0, d.total - settings.reserve) for d in devices}


class VramSwapper:
    """A pure function of the book's current numbers, the budgets and the model configs."""

    def __init__(
        self,
        book: FootprintBook,
        budgets: Mapping[int, int],
        models: Mapping[str, ModelConfig],
        *,
        evict_costs: Mapping[str, float] = EMPTY,
        device_labels: Mapping[int, str] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self._book = book
        self.budgets = dict(budgets)
        # What sleeping models still hold, per device (the router keeps it): not theirs to evict, but taken
        # from the room every other model has, until they wake (then it is their footprint again) or stop.
        self.asleep: Mapping[str, Mapping[int, int]] = {}
        self._models = models
        self._evict_costs = evict_costs
        self._labels = dict(device_labels or {})
        self._log = logger or logging.getLogger("llmswap.vram")

    def label(self, device: int) -> str:
        return self._labels.get(device, f"GPU {device}")

    def is_persistent(self, model: str) -> bool:
        cfg = self._models.get(model)
        return cfg is not None and cfg.persistent

    def cost_of(self, model: str) -> float:
        cost = self._evict_costs.get(model)
        if cost is None:
            cost = self._book.load_time(model)
        return max(0.0, cost) if cost is not None else DEFAULT_EVICT_COST

    def evictions_for(self, target: str, running: Sequence[str]) -> list[str]:
        return [e.model for e in self.plan(target, running).evict]

    def on_swap_start(self, target: str, running: Sequence[str]) -> None:
        try:
            plan = self.plan(target, running)
        except CannotFit as exc:
            self._log.warning("vram: %s", exc.message)
            return
        need = self._bytes_on_devices(plan.need)
        free = self._bytes_on_devices(plan.free_after)
        if not plan.evict:
            self._log.info("vram: loading %s (%s) beside what runs; free after: %s", target, need, free)
            return
        evicted = ", ".join(
            f"{e.model} ({self._bytes_on_devices(e.footprint)}, cost {e.cost:.1f} s)" for e in plan.evict
        )
        how = "" if plan.exact else " (greedy choice: too many candidates for an exact search)"
        self._log.info(
            "vram: loading %s (%s): evicting %s, total cost %.1f s%s; free after: %s",
            target, need, evicted, plan.cost, how, free,
        )  # fmt: skip

    def plan(self, target: str, running: Sequence[str]) -> VramPlan:
        """The cheapest eviction for `target`, with its numbers; raises `CannotFit` when none exists."""
        fp = self._book.footprint_of(target)
        need = {d: b for d, b in fp.per_device.items() if b > 0}
        others = [m for m in running if m != target]
        if target in running:
            return VramPlan(target, need, (), self._free_after(target, need, others, ()))
        # Where it was measured is where it lives; until then, where the config places it.
        placed = set(fp.per_device) if fp.learned is not None else set(self._book.devices_of(target))
        for device in sorted(placed | set(need)):
            if device not in self.budgets:
                known = ", ".join(self.label(d) for d in sorted(self.budgets)) or "none"
                raise CannotFit(
                    f"model {target} is placed on {self.label(device)}, which was not found "
                    f"(devices found: {known}); fix models.{target}.gpus"
                )
        # One reading of every footprint per decision: the book does not change during a call.
        sizes = {m: self._book.footprint_of(m).per_device for m in others}
        persistent = [m for m in others if self.is_persistent(m)]
        if fp.source == "default":
            need = self._need_unmeasured(target, need, persistent, sizes)
        self._check_fits_alone(target, fp.source, need, persistent, sizes)

        deficit = {d: _used(sizes, others, d) + self._asleep_on(d, target) + b - self.budgets[d]
                   for d, b in need.items()}
        deficit = {d: x for d, x in deficit.items() if x > 0}
        if not deficit:
            return VramPlan(target, need, (), self._free_after(target, need, others, ()))

        recency = sorted(others, key=lambda m: (_recency(self._book.last_used(m)), m))
        rank = {m: i for i, m in enumerate(recency)}
        candidates = [
            _Candidate(
                m,
                rank[m],
                round(self.cost_of(m) * _COST_UNIT),
                {d: sizes[m][d] for d in deficit if sizes[m].get(d, 0) > 0},
            )
            for m in others
            if not self.is_persistent(m)
        ]
        candidates = [c for c in candidates if c.freed]
        exact = len(candidates) <= MAX_EXACT_CANDIDATES
        chosen = _cheapest_exact(candidates, deficit) if exact else _cheapest_greedy(candidates, deficit)
        if chosen is None:
            # Unreachable after _check_fits_alone, which proves evicting every candidate suffices.
            raise CannotFit(f"model {target} cannot fit even after evicting every non-persistent model")
        chosen = sorted(chosen, key=lambda c: c.rank)
        evict = tuple(
            Eviction(c.model, sizes[c.model], c.cost / _COST_UNIT) for c in chosen
        )
        return VramPlan(target, need, evict, self._free_after(target, need, others, evict), exact)

    def _check_fits_alone(
        self,
        target: str,
        source: str,
        need: Mapping[int, int],
        persistent: Sequence[str],
        sizes: Mapping[str, Mapping[int, int]],
    ) -> None:
        for device, size in sorted(need.items()):
            budget = self.budgets[device]
            where = self.label(device)
            if size > budget:
                raise CannotFit(
                    f"model {target} needs {format_bytes(size)} on {where} but the budget is "
                    f"{format_bytes(budget)}; {self._fix_for(target, source)}"
                )
            kept = _used(sizes, persistent, device)
            if size + kept > budget:
                raise CannotFit(
                    f"model {target} needs {format_bytes(size)} on {where} but the budget is "
                    f"{format_bytes(budget)} and the persistent models {_holders(sizes, persistent, device)} "
                    f"keep {format_bytes(kept)} of it; make one of them non-persistent, or "
                    f"{self._fix_for(target, source)}"
                )

    def _need_unmeasured(
        self,
        target: str,
        devices: Mapping[int, int],
        persistent: Sequence[str],
        sizes: Mapping[str, Mapping[int, int]],
    ) -> dict[int, int]:
        """Room for a model of unknown size: all the budget the persistent models leave on its devices."""
        need = {}
        for device in sorted(devices):
            left = self.budgets[device] - _used(sizes, persistent, device)
            if left <= 0:
                raise CannotFit(
                    f"model {target} has no declared vram and was never measured, and the persistent "
                    f"models {_holders(sizes, persistent, device)} keep the whole budget of "
                    f"{self.label(device)} ({format_bytes(self.budgets[device])}); set models.{target}.vram"
                )
            need[device] = left
        return need

    def _fix_for(self, target: str, source: str) -> str:
        if source == "learned":
            return (
                f"it was measured at that size: give {target} more devices (models.{target}.gpus), "
                "a smaller context, or raise routing.router.settings.budget"
            )
        return f"lower models.{target}.vram or raise routing.router.settings.budget"

    def _free_after(
        self, target: str, need: Mapping[int, int], others: Sequence[str], evict: Sequence[Eviction]
    ) -> dict[int, int]:
        gone = {e.model for e in evict}
        sizes = {m: self._book.footprint_of(m).per_device for m in others if m not in gone}
        return {d: self.budgets.get(d, 0) - _used(sizes, sizes, d) - self._asleep_on(d, target) - b
                for d, b in sorted(need.items())}

    def _asleep_on(self, device: int, target: str) -> int:
        return sum(held.get(device, 0) for model, held in self.asleep.items() if model != target)

    def _bytes_on_devices(self, per_device: Mapping[int, int]) -> str:
        parts = [f"{format_bytes(b)} on {self.label(d)}" for d, b in sorted(per_device.items())]
        return ", ".join(parts) or "nothing"


def _used(sizes: Mapping[str, Mapping[int, int]], models: Iterable[str], device: int) -> int:
    return sum(sizes[m].get(device, 0) for m in models)


def _holders(sizes: Mapping[str, Mapping[int, int]], persistent: Sequence[str], device: int) -> str:
    return ", ".join(
        f"{m} ({format_bytes(sizes[m].get(device, 0))})" for m in persistent if sizes[m].get(device, 0) > 0
    )


@dataclass(frozen=True)
class _Candidate:
    model: str
    rank: int  # 0 = least recently used
    cost: int  # microseconds
    freed: Mapping[int, int]  # bytes freed on the devices in deficit


def _recency(last_used: float | None) -> float:
    # Never used (preloaded and never asked for) counts as the least recently used.
    return float("-inf") if last_used is None else last_used


def _key(chosen: Sequence[_Candidate]) -> tuple[int, tuple[int, ...]]:
    """Lower is better: summed cost, then the most recently used member (LRU-first eviction).

    Comparing the ranks sorted from most to least recent makes a strict superset always worse than
    its subset, so the search can stop adding models as soon as a set fits.
    """
    return sum(c.cost for c in chosen), tuple(sorted((c.rank for c in chosen), reverse=True))


def _cheapest_exact(candidates: Sequence[_Candidate], deficit: Mapping[int, int]) -> list[_Candidate] | None:
    """Branch and bound over subsets: cheap candidates first, prune on cost and on what is left to free."""
    order = sorted(candidates, key=lambda c: (c.cost, c.rank))
    devices = list(deficit)
    # reachable[i][d]: bytes the candidates from i on can still free on d, to drop hopeless branches.
    reachable = [dict.fromkeys(devices, 0) for _ in range(len(order) + 1)]
    for i in range(len(order) - 1, -1, -1):
        for d in devices:
            reachable[i][d] = reachable[i + 1][d] + order[i].freed.get(d, 0)
    best: list[_Candidate] | None = None
    best_key: tuple[int, tuple[int, ...]] | None = None

    def search(i: int, chosen: list[_Candidate], cost: int, left: dict[int, int]) -> None:
        nonlocal best, best_key
        if all(x <= 0 for x in left.values()):
            key = _key(chosen)
            if best_key is None or key < best_key:
                best, best_key = list(chosen), key
            return
        if i == len(order) or (best_key is not None and cost > best_key[0]):
            return
        if any(left[d] > reachable[i][d] for d in devices):
            return
        c = order[i]
        chosen.append(c)
        search(i + 1, chosen, cost + c.cost, {d: x - c.freed.get(d, 0) for d, x in left.items()})
        chosen.pop()
        search(i + 1, chosen, cost, left)

    search(0, [], 0, dict(deficit))
    return best


def _cheapest_greedy(
    candidates: Sequence[_Candidate], deficit: Mapping[int, int]
) -> list[_Candidate] | None:
    """Repeatedly take the lowest cost per still-needed byte, then drop the priciest picks not needed."""
    left = dict(deficit)
    pool = list(candidates)
    chosen: list[_Candidate] = []

    def useful(c: _Candidate) -> int:
        return sum(min(b, left[d]) for d, b in c.freed.items() if left.get(d, 0) > 0)

    while any(x > 0 for x in left.values()):
        pool = [c for c in pool if useful(c) > 0]
        if not pool:
            return None
        pick = min(pool, key=lambda c: (c.cost / useful(c), c.rank))
        pool.remove(pick)
        chosen.append(pick)
        left = {d: x - pick.freed.get(d, 0) for d, x in left.items()}
    for c in sorted(chosen, key=lambda c: (-c.cost, -c.rank)):
        rest = [o for o in chosen if o is not c]
        if all(sum(o.freed.get(d, 0) for o in rest) >= x for d, x in deficit.items()):
            chosen = rest
    return chosen
