"""A stand-in for the `pynvml` module: the few NVML calls `NvmlReader` makes, over in-memory GPUs.

It keeps NVML's rules that matter to a caller: nothing works before `nvmlInit`, errors are
`NVMLError`, and per-process memory may be unavailable (`usedGpuMemory` None).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    pass


@dataclass
class FakeGpu:
    name: str | bytes
    total: int
    used: int = 0
    compute: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, usedGpuMemory)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    graphics_supported: bool = True
    util: int = 0
    temperature: int = 40
    fan: int | None = None  # None: the board has no fan gauge (NVML says "Not Supported")
    power_mw: int = 100_000
    uuid: str | bytes = "GPU-00000000"


class FakeNvml:
    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, gpus: list[FakeGpu], *, init_error: str | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.initialised = False
        self.init_calls = 0
        self.shutdown_calls = 0

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._require_init()
        self.shutdown_calls += 1
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._require_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._require_init()
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str | bytes:
        self._require_init()
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> SimpleNamespace:
        self._require_init()
        return SimpleNamespace(total=handle.total, used=handle.used, free=handle.total - handle.used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[SimpleNamespace]:
        self._require_init()
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle.compute]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeGpu) -> list[SimpleNamespace]:
        self._require_init()
        if not handle.graphics_supported:
            raise NVMLError("Not Supported")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle.graphics]

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> SimpleNamespace:
        self._require_init()
        return SimpleNamespace(gpu=handle.util, memory=0)

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        self._require_init()
        return handle.temperature

    def nvmlDeviceGetFanSpeed(self, handle: FakeGpu) -> int:
        self._require_init()
        if handle.fan is None:
            raise NVMLError("Not Supported")
        return handle.fan

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        self._require_init()
        return handle.power_mw

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str | bytes:
        self._require_init()
        return handle.uuid

    def nvmlSystemGetDriverVersion(self) -> bytes:
        self._require_init()
        return b"550.54"

    def _require_init(self) -> None:
        if not self.initialised:
            raise NVMLError("Uninitialized")
