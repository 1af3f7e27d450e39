"""Performance sampling (`performance:`): the machine's CPU, memory, swap, load and network, and each GPU's
gauges, every `every` seconds, kept for an hour in rings (llama-swap's `/api/performance` data).

A sample is taken off the event loop (psutil and NVML calls may block briefly); the first one right at
start, so the routes have data at once. GPUs are read through the memory reader's `GpuGauges` side
(NVML, or the fake reader in tests); a host-RAM reader has no GPUs, so there are no GPU samples.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import psutil

from llmswap.machine.reader import GpuGauges, GpuReading

log = logging.getLogger("llmswap.perf")

KEEP_SECONDS = 3600
MB = 1024 * 1024


@dataclass(frozen=True)
class NetIo:
    name: str
    bytes_recv: int
    bytes_sent: int


@dataclass(frozen=True)
class SysStat:
    timestamp: float
    cpu_util_per_core: list[float]
    mem_total_mb: float
    mem_used_mb: float
    mem_free_mb: float
    swap_total_mb: float
    swap_used_mb: float
    load_avg_1: float
    load_avg_5: float
    load_avg_15: float
    net_io: list[NetIo]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "timestamp": _stamp(self.timestamp)}


@dataclass(frozen=True)
class GpuStat:
    timestamp: float
    reading: GpuReading

    def as_dict(self) -> dict[str, Any]:
        r = self.reading
        used, total = r.memory_used / MB, r.memory_total / MB
        return {
            "timestamp": _stamp(self.timestamp), "id": r.index, "name": r.name, "uuid": r.uuid,
            "temp_c": r.temp_c, "vram_temp_c": None, "gpu_util_pct": r.util_pct,
            "mem_util_pct": used / total * 100 if total else None, "mem_used_mb": used, "mem_total_mb": total,
            "fan_speed_pct": r.fan_pct, "power_draw_w": r.power_w,
        }


def _stamp(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def system_sample(now: float) -> SysStat:
    """One reading of the host (psutil). CPU use is since the previous call (0 on the very first)."""
    memory, swap = psutil.virtual_memory(), psutil.swap_memory()
    try:
        load = psutil.getloadavg()
    except (AttributeError, OSError):
        load = (0.0, 0.0, 0.0)
    net = psutil.net_io_counters(pernic=True)
    return SysStat(
        timestamp=now, cpu_util_per_core=[float(v) for v in psutil.cpu_percent(percpu=True)],
        mem_total_mb=memory.total / MB, mem_used_mb=(memory.total - memory.available) / MB,
        mem_free_mb=memory.available / MB, swap_total_mb=swap.total / MB, swap_used_mb=swap.used / MB,
        load_avg_1=load[0], load_avg_5=load[1], load_avg_15=load[2],
        net_io=[NetIo(name, c.bytes_recv, c.bytes_sent) for name, c in sorted(net.items()) if name != "lo"],
    )


class PerformanceMonitor:
    """Rings of system and GPU samples; `start` samples every `every` seconds until `stop`."""

    def __init__(self, every: float, gauges: Callable[[], GpuGauges | None],
                 clock: Callable[[], float] = time.time) -> None:
        self.every = every
        self._gauges = gauges
        self._clock = clock
        size = max(1, int(KEEP_SECONDS / every))
        self.system: deque[SysStat] = deque(maxlen=size)
        self.gpus: deque[list[GpuStat]] = deque(maxlen=size)  # one entry per tick: every GPU
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        """Take one sample of everything (blocking: call it off the event loop)."""
        now = self._clock()
        self.system.append(system_sample(now))
        gauges = self._gauges()
        if gauges is None:
            return
        try:
            readings = gauges.readings()
        except Exception as exc:
            log.warning("performance: reading the GPUs failed (%s); trying again at the next sample", exc)
            return
        if readings:
            self.gpus.append([GpuStat(now, reading) for reading in readings])

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="performance monitor")

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.sample)
            except Exception:
                log.exception("performance: a sample failed")
            await asyncio.sleep(self.every)

    def cancel(self) -> None:
        """Stop sampling (the task ends at its next await)."""
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def latest_system(self) -> SysStat | None:
        return self.system[-1] if self.system else None

    def latest_gpus(self) -> list[GpuStat]:
        return list(self.gpus[-1]) if self.gpus else []

    def report(self, after: float | None) -> dict[str, Any]:
        """`/api/performance`'s body: samples strictly newer than `after` (`[]` when none and `after` was
        given, `null` when none at all, as llama-swap)."""
        system = [s.as_dict() for s in self.system if after is None or s.timestamp > after]
        gpus = [g.as_dict() for tick in self.gpus for g in tick if after is None or g.timestamp > after]
        return {"enabled": True, "sys_stats": system if system or after is not None else None,
                "gpu_stats": gpus if gpus or after is not None else None}
