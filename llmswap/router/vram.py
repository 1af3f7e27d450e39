"""The vram router's policy: evictions decided by measured memory footprints against a budget.

Beside its swapper it (1) waits, after evicting, until the freed memory is visible before starting
the target (drivers release memory asynchronously; Ollama does the same), (2) recovers from an
out-of-memory start by evicting every idle non-persistent model and retrying once, and (3) learns
each model's footprint and load time from readings, persisted across restarts.

Footprints come from per-process readings (the upstream's process tree). Where those are empty — NVML
inside a container with its own PID namespace reports host PIDs, which match none of ours — a start is
measured by how much the devices' used memory grew across it instead, provided nothing else moved
meanwhile: no other model changed state during the start, and none was starting or stopping at either end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmswap.config.model import Config
from llmswap.machine import (
    FootprintBook,
    MemoryReader,
    device_labels,
    format_bytes,
    open_reader,
    wait_for_free,
)
from llmswap.process.errors import StartFailed
from llmswap.process.events import LifeTimes, ProcessEvent
from llmswap.process.state import ProcessState
from llmswap.router.policy import RouterPolicy
from llmswap.router.types import ProcessLike
from llmswap.scheduler.swappers.vram import VramSwapper, device_budgets
from llmswap.scheduler.types import SwapPlan

# Process states in which an upstream's memory is not expected to move by much.
_SETTLED = frozenset({ProcessState.READY, ProcessState.STOPPED, ProcessState.SHUTDOWN, ProcessState.SLEEPING})

log = logging.getLogger("llmswap.router.vram")

# What llama.cpp, vLLM/PyTorch, CUDA and Vulkan print when an allocation fails.
_OOM = re.compile(
    r"out of memory|outofmemory|cudamalloc failed|failed to allocate|insufficient memory|"
    r"erroroutofdevicememory|cuda_error_out_of_memory",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class _MemoryMark:
    """The devices' used memory when a start began, and the event generation it was read at."""

    generation: int
    used: Mapping[int, int]


def looks_like_oom(text: str) -> bool:
    return _OOM.search(text) is not None


class VramPolicy(RouterPolicy):
    # Its `state_of`, `adjust_running` and `granted` act (`adjusts`): a model being evicted to make room
    # shows as stopping, and grants mark models used.

    def __init__(
        self,
        config: Config,
        *,
        reader: MemoryReader | None = None,
        sample_interval: float = 2.0,
        memory_wait: float = 5.0,
    ) -> None:
        self.reader = reader if reader is not None else open_reader(logger=log)
        budgets = device_budgets(config.routing.router.vram, self.reader.devices())
        self.book = FootprintBook.for_config(config, budgets, logger=log)
        swapper = VramSwapper(
            self.book, budgets, config.models, evict_costs=config.routing.router.vram.evict_costs,
            device_labels=device_labels(self.reader), logger=log,
        )
        super().__init__("vram", swapper)
        self.vram_swapper = swapper
        self.residues: dict[str, dict[int, int]] = {}  # sleeping model -> bytes it still holds, per device
        swapper.asleep = self.residues
        self.sample_interval = sample_interval
        self.memory_wait = memory_wait
        self.last_memory_wait: dict[str, float] = {}  # target -> seconds waited for memory before its start
        self.oom_retries = 0
        # Models being stopped by OOM recovery: reported as stopping at once, so the scheduler grants them
        # to nobody between the decision and the process noticing its stop.
        self._evicting: set[str] = set()
        self._sampler: asyncio.Task[None] | None = None
        # Every process event bumps the generation; `_moved_at[model]` is the generation of its latest.
        self._generation = 0
        self._moved_at: dict[str, int] = {}
        self._delta_explained: set[str] = set()  # models whose device-delta learning was logged once

    @property
    def memory_reader(self) -> MemoryReader:
        return self.reader

    @property
    def processes(self) -> Mapping[str, ProcessLike]:
        return self.parts.processes

    # ------------------------------------------------------------------ lifecycle

    def begin(self) -> None:
        if self._sampler is None and self.sample_interval > 0:
            loop = asyncio.get_running_loop()
            self._sampler = loop.create_task(self._sample_forever(), name="vram-sampler")

    async def end(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        self.book.save()
        self.reader.close()

    # ------------------------------------------------------------------ what the scheduler sees

    def state_of(self, model: str, state: ProcessState) -> ProcessState:
        return ProcessState.STOPPING if model in self._evicting else state

    def adjust_running(self, running: dict[str, ProcessState]) -> dict[str, ProcessState]:
        for model in self._evicting & running.keys():
            running[model] = ProcessState.STOPPING
        return running

    def granted(self, model: str) -> None:
        self.book.mark_used(model, self.parts.clock())

    # ------------------------------------------------------------------ swap hooks

    async def after_evictions(self, plan: SwapPlan) -> None:
        need = self.book.footprint_of(plan.model).per_device
        waited = await wait_for_free(self.reader, need, timeout=self.memory_wait)
        self.last_memory_wait[plan.model] = waited
        if waited >= self.memory_wait:
            log.warning("vram: %s: freed memory still not visible after %.1fs; starting anyway",
                        plan.model, waited)
        elif waited > 0:
            log.info("vram: %s: waited %.2fs for evicted memory to come back", plan.model, waited)

    async def bring_up(self, process: ProcessLike) -> LifeTimes | None:
        mark = self._memory_mark(process.id)
        try:
            times = await process.ensure_ready()
        except StartFailed as exc:
            if not self._start_ran_out_of_memory(process, exc):
                raise
            victims = self._idle_victims(process.id)
            if not victims:
                raise
            await self._recover_from_oom(process, victims, exc)
            mark = self._memory_mark(process.id)
            times = await process.ensure_ready()
        self._learn(process, mark)
        return times

    def _start_ran_out_of_memory(self, process: ProcessLike, exc: StartFailed) -> bool:
        logs = getattr(process, "logs", None)
        recent = "\n".join(logs.tail(40)) if logs is not None else ""
        return looks_like_oom(str(exc)) or looks_like_oom(recent)

    def _idle_victims(self, target: str) -> list[str]:
        return sorted(
            m for m, p in self.processes.items()
            if m != target and p.state is ProcessState.READY and not self.parts.busy(m)
            and not self.vram_swapper.is_persistent(m)
        )

    async def _recover_from_oom(self, process: ProcessLike, victims: list[str], exc: StartFailed) -> None:
        self.oom_retries += 1
        log.warning("vram: %s ran out of memory while starting (%s); evicting idle models %s, retrying once",
                    process.id, exc, victims)
        self._evicting.update(victims)
        try:
            await asyncio.gather(*(self.processes[m].stop(self.processes[m].config.unload_timeout)
                                   for m in victims))
        finally:
            self._evicting.difference_update(victims)
        evictions = self.parts.stats.evictions
        for victim in victims:
            evictions[victim] = evictions.get(victim, 0) + 1
        need = self.book.footprint_of(process.id).per_device
        await wait_for_free(self.reader, need, timeout=self.memory_wait)

    # ------------------------------------------------------------------ learning

    def _learn(self, process: ProcessLike, mark: _MemoryMark | None) -> None:
        if process.last_start_duration is not None:
            self.book.record_load_time(process.id, process.last_start_duration)
        if not self._sample(process) and mark is not None:
            self._learn_from_devices(process, mark)

    def _sample(self, process: ProcessLike) -> bool:
        """Record the process tree's reading; False when there was none to record."""
        pid = process.pid
        if pid is None or process.state is not ProcessState.READY:
            return False
        try:
            usage = self.reader.process_usage(pid)
        except Exception:
            log.exception("vram: reading the memory of %s (pid %d) failed", process.id, pid)
            return False
        if usage and self.book.observe(process.id, usage):
            self.book.save()
        return bool(usage)

    def process_event(self, event: ProcessEvent) -> None:
        self._generation += 1
        self._moved_at[event.model] = self._generation
        if event.kind == "slept":
            self._hold_residue(event.model)
        elif event.kind in ("woke", "stopped", "exited", "start_failed"):
            self.residues.pop(event.model, None)

    def _hold_residue(self, model: str) -> None:
        """A sleeping model holds no footprint, but what its process still holds (a CUDA context, say) is
        taken from every other model's room until it wakes or stops (`VramSwapper.asleep`)."""
        process = self.processes.get(model)
        pid = process.pid if process is not None else None
        try:
            usage = self.reader.process_usage(pid) if pid is not None else {}
        except Exception:
            log.exception("vram: reading the memory of sleeping %s failed", model)
            usage = {}
        residue = {device: size for device, size in usage.items() if size > 0}
        if residue:
            held = ", ".join(f"{format_bytes(n)} on GPU {d}" for d, n in sorted(residue.items()))

            log.info("vram: %s sleeps holding %s", model, held)
            self.residues[model] = residue

    def _others_settled(self, model: str) -> bool:
        return all(p.state in _SETTLED for m, p in self.processes.items() if m != model)

    def _memory_mark(self, model: str) -> _MemoryMark | None:
        """The devices' used memory before `model` starts, if a later difference can be put down to it."""
        if not self._others_settled(model):
            return None
        try:
            used = {device.index: device.used for device in self.reader.devices()}
        except Exception:
            log.exception("vram: reading the devices before starting %s failed", model)
            return None
        return _MemoryMark(self._generation, used)

    def _learn_from_devices(self, process: ProcessLike, mark: _MemoryMark) -> None:
        """No per-process reading: learn what the devices' used memory grew by while only it started."""
        moved = any(at > mark.generation for m, at in self._moved_at.items() if m != process.id)
        if moved or not self._others_settled(process.id) or process.state is not ProcessState.READY:
            return
        try:
            now = {device.index: device.used for device in self.reader.devices()}
        except Exception:
            log.exception("vram: reading the devices after starting %s failed", process.id)
            return
        grown = {d: used - mark.used.get(d, 0) for d, used in now.items() if used > mark.used.get(d, 0)}
        if not grown:
            return
        if process.id not in self._delta_explained:
            self._delta_explained.add(process.id)
            log.info("vram: %s: no per-process memory readings (a container's PID namespace hides them); "
                     "measured %s as the devices' growth across its start", process.id,
                     format_bytes(sum(grown.values())))
        if self.book.observe(process.id, grown):
            self.book.save()

    async def _sample_forever(self) -> None:
        # Footprints grow after ready (KV cache, first batches): keep the peak while a model runs.
        while True:
            await asyncio.sleep(self.sample_interval)
            for process in list(self.processes.values()):
                self._sample(process)

    # ------------------------------------------------------------------ reporting

    def model_extras(self, model: str) -> dict[str, Any]:
        footprint = self.book.footprint_of(model)
        return {
            "vram": {
                "footprint": footprint.total,
                "footprint_human": format_bytes(footprint.total),
                "source": footprint.source,
                "declared": footprint.declared,
                "learned": footprint.learned,
                "devices": sorted(footprint.per_device),
                "load_seconds": self.book.load_time(model),
            }
        }

    def router_extras(self) -> dict[str, Any]:
        running = [m for m, p in self.processes.items() if p.state.is_running]
        devices = {}
        for device, budget in sorted(self.vram_swapper.budgets.items()):
            asleep = sum(held.get(device, 0) for held in self.residues.values())
            used = sum(self.book.footprint_of(m).per_device.get(device, 0) for m in running) + asleep
            devices[self.vram_swapper.label(device)] = {"budget": budget, "in_use": used,
                                                   "budget_human": format_bytes(budget),
                                                   "in_use_human": format_bytes(used), "asleep": asleep}
        return {"vram": {"reader": self.reader.kind, "devices": devices}}
