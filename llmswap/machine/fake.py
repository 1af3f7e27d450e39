"""A memory reader for tests: settable devices, plus the per-PID files the demo upstream writes.

The demo upstream run with `--fake-vram SIZE --fake-gpu-dir DIR` writes `DIR/<pid>` holding its
footprint in bytes (optionally followed by a device index: `<bytes> <device>`) once healthy and removes
it on exit. A SIGKILLed demo leaves its file behind, so only files of live processes count.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from llmswap.machine.reader import DeviceMemory, GpuReading, process_tree
from llmswap.machine.units import GiB

# psutil derives a process's start time from the boot time, which it rounds: allow this much skew when
# deciding whether a process was born after the file was written (and so merely reuses a dead pid).
_START_TIME_SLACK = 1.0


class FakeReader:
    kind = "fake"

    def __init__(
        self,
        totals: Sequence[int] = (24 * GiB,),
        *,
        gpu_dir: str | os.PathLike[str] | None = None,
        names: Sequence[str] | None = None,
        per_process: bool = True,
    ) -> None:
        """`per_process=False` reports no per-process usage (devices still count it), as NVML does inside
        a container whose PID namespace hides the host PIDs it lists."""
        self.per_process = per_process
        self._lock = threading.Lock()
        self._totals = {i: int(t) for i, t in enumerate(totals)}
        self._names = {i: (names[i] if names else f"Fake GPU {i}") for i in self._totals}
        self._extra: dict[int, int] = {}
        self._pids: dict[int, dict[int, int]] = {}
        self._gauges: dict[int, dict[str, float]] = {}
        self.gpu_dir = Path(gpu_dir) if gpu_dir is not None else None

    def set_total(self, device: int, total: int) -> None:
        with self._lock:
            self._totals[device] = total
            self._names.setdefault(device, f"Fake GPU {device}")

    def set_extra_used(self, device: int, used: int) -> None:
        """Memory used on `device` by something no model owns (another program, a driver)."""
        with self._lock:
            self._extra[device] = used

    def set_process_usage(self, pid: int, usage: Mapping[int, int] | None) -> None:
        """Pretend `pid` uses these bytes per device (None forgets it); `pid` need not be a real process."""
        with self._lock:
            if usage is None:
                self._pids.pop(pid, None)
            else:
                self._pids[pid] = {d: int(b) for d, b in usage.items() if b}

    def file_usage(self) -> dict[int, dict[int, int]]:
        """pid -> device -> bytes, from the live processes' files in `gpu_dir`."""
        if self.gpu_dir is None:
            return {}
        found: dict[int, dict[int, int]] = {}
        try:
            entries = list(os.scandir(self.gpu_dir))
        except FileNotFoundError:
            return {}
        for entry in entries:
            # Only `<pid>` names: the demo writes to a temporary name first and renames it into place.
            if not entry.name.isdigit():
                continue
            parsed = _read_pid_file(Path(entry.path))
            if parsed is None:
                continue
            written_at, used, device = parsed
            pid = int(entry.name)
            if used > 0 and _alive_since(pid, written_at):
                found.setdefault(pid, {})
                found[pid][device] = found[pid].get(device, 0) + used
        return found

    def devices(self) -> list[DeviceMemory]:
        files = self.file_usage()
        with self._lock:
            used = dict(self._extra)
            for per_device in (*files.values(), *self._pids.values()):
                for device, size in per_device.items():
                    used[device] = used.get(device, 0) + size
            return [
                DeviceMemory(
                    index,
                    self._names[index],
                    total=total,
                    used=used.get(index, 0),
                    free=max(0, total - used.get(index, 0)),
                )
                for index, total in sorted(self._totals.items())
            ]

    def set_gauges(self, device: int, **gauges: float) -> None:
        """What `readings` reports for `device`: util_pct, temp_c, fan_pct, power_w."""
        with self._lock:
            self._gauges[device] = dict(gauges)

    def readings(self) -> list[GpuReading]:
        with self._lock:
            gauges = {index: dict(values) for index, values in self._gauges.items()}
        return [
            GpuReading(d.index, d.name, f"GPU-fake-{d.index}", memory_used=d.used, memory_total=d.total,
                       **gauges.get(d.index, {}))
            for d in self.devices()
        ]

    def driver_version(self) -> str | None:
        return "fake"

    def process_usage(self, pid: int) -> dict[int, int]:
        if not self.per_process:
            return {}
        tree = process_tree(pid)
        files = self.file_usage()
        usage: dict[int, int] = {}
        with self._lock:
            sources = [files.get(p, {}) for p in tree] + [self._pids.get(p, {}) for p in tree]
        for per_device in sources:
            for device, size in per_device.items():
                usage[device] = usage.get(device, 0) + size
        return usage

    def close(self) -> None:
        pass


def _read_pid_file(path: Path) -> tuple[float, int, int] | None:
    """(mtime, bytes, device), or None for a file that vanished or does not hold `<bytes> [<device>]`."""
    try:
        written_at = path.stat().st_mtime
        fields = path.read_text().split()
    except OSError:
        return None
    if len(fields) not in (1, 2) or not all(f.isdigit() for f in fields):
        return None
    device = int(fields[1]) if len(fields) == 2 else 0
    return written_at, int(fields[0]), device


def _alive_since(pid: int, written_at: float) -> bool:
    """Whether `pid` is a live process that already existed when its file was written."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return proc.create_time() <= written_at + _START_TIME_SLACK
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
