"""Host RAM as a single device (index 0), for CPU-only and unified-memory machines."""

from __future__ import annotations

import psutil

from llmswap.machine.reader import DeviceMemory

HOST_DEVICE = 0


class HostReader:
    kind = "host"

    def devices(self) -> list[DeviceMemory]:
        vm = psutil.virtual_memory()
        # `available` (not `free`) counts reclaimable page cache, which is what a new model can really get.
        free = min(vm.available, vm.total)
        return [DeviceMemory(HOST_DEVICE, "host RAM", total=vm.total, used=vm.total - free, free=free)]

    def process_usage(self, pid: int) -> dict[int, int]:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return {}
        total = 0
        for proc in procs:
            # RSS counts shared pages in every process that maps them: an overestimate, the safe direction.
            try:
                total += proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return {HOST_DEVICE: total} if total > 0 else {}

    def close(self) -> None:
        pass
