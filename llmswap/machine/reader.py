"""The one interface every memory reading goes through: devices and per-process-tree usage.

Three readers implement it: `NvmlReader` (NVIDIA GPUs), `HostReader` (host RAM, for CPU-only and
unified-memory machines) and `FakeReader` (tests and the demo upstream's fake GPU). Device indices
are the reader's own: NVML orders GPUs by PCI bus, which is also what `CUDA_DEVICE_ORDER=PCI_BUS_ID`
gives CUDA programs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import psutil


@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory at the moment of reading, in bytes."""

    index: int
    name: str
    total: int
    used: int
    free: int


@dataclass(frozen=True)
class GpuReading:
    """One GPU's gauges at the moment of reading (None: the device or driver does not report it)."""

    index: int
    name: str
    uuid: str
    memory_used: int  # bytes
    memory_total: int
    util_pct: float | None = None
    temp_c: float | None = None
    fan_pct: float | None = None
    power_w: float | None = None


@runtime_checkable
class GpuGauges(Protocol):
    """Readers of real (or fake) GPUs also give their gauges: NVML and the fake reader do; host RAM does
    not. Check with `isinstance(reader, GpuGauges)`."""

    kind: str  # as MemoryReader's

    def readings(self) -> list[GpuReading]: ...

    def driver_version(self) -> str | None: ...


class MemoryReader(Protocol):
    kind: str  # "nvml" | "host" | "fake"

    def devices(self) -> list[DeviceMemory]:
        """Every device this reader sees, ordered by index."""

    def process_usage(self, pid: int) -> dict[int, int]:
        """Device index -> bytes used by `pid` and all its descendants; devices with nothing are left out."""

    def close(self) -> None: ...


def process_tree(pid: int) -> set[int]:
    """`pid` and every live descendant; just `{pid}` when psutil cannot see the process.

    An upstream is often a wrapper (a shell, `docker run`, a launcher) whose child holds the memory, so
    usage is always summed over the tree.
    """
    try:
        children = psutil.Process(pid).children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return {pid}
    return {pid, *(child.pid for child in children)}


def device_labels(reader: MemoryReader) -> dict[int, str]:
    """How messages name each device: `GPU 0`, or `host RAM` when the reader measures host memory."""
    if reader.kind == "host":
        return {d.index: "host RAM" for d in reader.devices()}
    return {d.index: f"GPU {d.index}" for d in reader.devices()}
