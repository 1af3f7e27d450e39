"""NVIDIA GPU memory through NVML (the `nvidia-ml-py` package, imported as `pynvml`)."""

from __future__ import annotations

from typing import Any

from llmswap.machine.reader import DeviceMemory, GpuReading, process_tree


class NvmlReader:
    """Initialises NVML on construction (raising whatever NVML raises) and shuts it down on `close`.

    `nvml` is the `pynvml` module; tests pass an object with the same functions instead. NVML reports
    host PIDs: inside a container with its own PID namespace per-process usage comes back empty, and the
    vram router then measures a start by the devices' growth across it (see `router/vram.py`).
    """

    kind = "nvml"

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
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

    def readings(self) -> list[GpuReading]:
        """Memory, utilisation, temperature, fan and power of each GPU (a gauge the board lacks is None)."""
        nvml = self._nvml
        result = []
        for device in self.devices():
            handle = self._handles[device.index]
            util = self._optional(lambda h=handle: nvml.nvmlDeviceGetUtilizationRates(h).gpu)
            temp = self._optional(
                lambda h=handle: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
            fan = self._optional(lambda h=handle: nvml.nvmlDeviceGetFanSpeed(h))
            power_mw = self._optional(lambda h=handle: nvml.nvmlDeviceGetPowerUsage(h))
            uuid = self._optional(lambda h=handle: nvml.nvmlDeviceGetUUID(h))
            result.append(GpuReading(
                device.index, device.name, uuid.decode() if isinstance(uuid, bytes) else str(uuid or ""),
                memory_used=device.used, memory_total=device.total,
                util_pct=None if util is None else float(util), temp_c=None if temp is None else float(temp),
                fan_pct=None if fan is None else float(fan),
                power_w=None if power_mw is None else float(power_mw) / 1000,
            ))
        return result

    def driver_version(self) -> str | None:
        version = self._optional(self._nvml.nvmlSystemGetDriverVersion)
        return version.decode() if isinstance(version, bytes) else version

    def _optional(self, read: Any) -> Any:
        # Boards differ in which gauges they have (no fan on passively cooled ones, no power on some
        # laptops): a gauge that errors is just absent.
        try:
            return read()
        except Exception:
            return None

    def close(self) -> None:
        if self._open:
            self._open = False
            self._nvml.nvmlShutdown()
