"""NVIDIA GPU memory through NVML (the `nvidia-ml-py` package, imported as `pynvml`)."""

from __future__ import annotations

from typing import Any

from llmswap.gpu.reader import DeviceMemory, process_tree


class NvmlReader:
    """Initialises NVML on construction (raising whatever NVML raises) and shuts it down on `close`.

    `nvml` is the `pynvml` module; tests pass an object with the same functions instead. NVML reports
    host PIDs: inside a container with its own PID namespace per-process usage comes back empty, and the
    vram router then measures a start by the devices' growth across it (see `router/vram.py`).
    """

    kind = "nvml"

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml as nvml
        self._nvml = nvml
        nvml.nvmlInit()
        self._open = True
        try:
            count = nvml.nvmlDeviceGetCount()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception:
            self.close()
            raise

    def devices(self) -> list[DeviceMemory]:
        result = []
        for index, handle in enumerate(self._handles):
            mem = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            name = self._nvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):  # older pynvml versions return the raw C string
                name = name.decode(errors="replace")
            result.append(DeviceMemory(index, name, total=mem.total, used=mem.used, free=mem.free))
        return result

    def process_usage(self, pid: int) -> dict[int, int]:
        tree = process_tree(pid)
        usage: dict[int, int] = {}
        for index, handle in enumerate(self._handles):
            per_pid: dict[int, int] = {}
            for listing in (
                self._nvml.nvmlDeviceGetComputeRunningProcesses,
                self._nvml.nvmlDeviceGetGraphicsRunningProcesses,
            ):
                try:
                    procs = listing(handle)
                except self._nvml.NVMLError:
                    # Some boards and vGPU guests lack one of the listings: read what the other says.
                    continue
                for proc in procs:
                    used = proc.usedGpuMemory
                    # None: the driver cannot attribute memory per process (Windows WDDM); nothing to count.
                    if proc.pid in tree and used:
                        # A process in both listings is one allocation seen twice, not two.
                        per_pid[proc.pid] = max(per_pid.get(proc.pid, 0), used)
            if per_pid:
                usage[index] = sum(per_pid.values())
        return usage

    def close(self) -> None:
        if self._open:
            self._open = False
            self._nvml.nvmlShutdown()
