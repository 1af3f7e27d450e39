"""What machine llmswap runs on (`/api/hardware`, llama-swap's schema version 1): architecture, operating
system, environment (native, container, virtual machine, WSL), CPU, memory and accelerators. Detected
once, at start; a fact that cannot be found is `null` (or `unknown`), never a placeholder.
"""

from __future__ import annotations

import os
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from llmswap import __version__
from llmswap.machine.reader import GpuGauges, MemoryReader

_ARCHITECTURES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64",
                  "armv7l": "armv7", "ppc64le": "ppc64le", "riscv64": "riscv64", "s390x": "s390x"}
_FAMILIES = {"linux": "linux", "darwin": "macos", "win32": "windows", "freebsd": "freebsd"}


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _os_release() -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in _read("/etc/os-release").splitlines():
        name, _, value = line.partition("=")
        if value:
            fields[name.strip()] = value.strip().strip('"')
    return fields


def _environment() -> dict[str, Any]:
    if "microsoft" in platform.release().lower():
        return {"kind": "wsl", "name": "WSL", "version": None}
    cgroup = _read("/proc/1/cgroup")
    if Path("/.dockerenv").exists() or "docker" in cgroup:
        return {"kind": "container", "name": "docker", "version": None}
    if Path("/run/.containerenv").exists():
        return {"kind": "container", "name": "podman", "version": None}
    if "kubepods" in cgroup or os.environ.get("KUBERNETES_SERVICE_HOST"):
        return {"kind": "container", "name": "kubernetes", "version": None}
    if sys.platform != "linux":
        return {"kind": "unknown", "name": None, "version": None}
    if " hypervisor" in _read("/proc/cpuinfo"):
        vendor = _read("/sys/class/dmi/id/sys_vendor").strip() or None
        return {"kind": "virtual_machine", "name": vendor, "version": None}
    return {"kind": "native", "name": None, "version": None}


def _cpu() -> dict[str, Any]:
    vendor = model = None
    sockets: set[str] = set()
    for line in _read("/proc/cpuinfo").splitlines():
        name, _, value = line.partition(":")
        name, value = name.strip(), value.strip()
        if name == "vendor_id" and vendor is None:
            vendor = value
        elif name == "model name" and model is None:
            model = value
        elif name == "physical id":
            sockets.add(value)
    return {"vendor": vendor, "model": model or (platform.processor() or None),
            "socket_count": len(sockets) or None, "physical_core_count": psutil.cpu_count(logical=False),
            "logical_thread_count": psutil.cpu_count(logical=True)}


def _accelerators(reader: GpuGauges | MemoryReader | None) -> list[dict[str, Any]]:
    if reader is None or not isinstance(reader, GpuGauges):
        return []
    driver_version = reader.driver_version()
    vendor = "NVIDIA" if reader.kind == "nvml" else None
    driver = {"name": "nvidia" if reader.kind == "nvml" else reader.kind, "version": driver_version}
    return [{"index": position, "kind": "gpu", "vendor": vendor, "model": reading.name, "architecture": None,
             "memory": {"kind": "dedicated", "capacity_bytes": reading.memory_total},
             "driver": driver if driver_version else None, "power_limit_watts": None}
            for position, reading in enumerate(reader.readings())]


def detect(reader: GpuGauges | MemoryReader | None) -> dict[str, Any]:
    """The hardware report (blocking: call it off the event loop)."""
    machine = platform.machine().lower()
    arch = _ARCHITECTURES.get(machine, "other")
    family = _FAMILIES.get(sys.platform, "other")
    release = _os_release()
    operating_system: dict[str, Any] = {
        "family": family, "name": release.get("NAME") or platform.system() or None,
        "version": release.get("VERSION_ID") or platform.version() or None,
        "kernel": platform.release() or None,
    }
    if family == "other":
        operating_system["raw_family"] = sys.platform
    return {
        "schema_version": 1,
        "captured_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "capture": {"scope": "inference_host", "method": "detected",
                    "detector": {"name": "llmswap", "version": __version__}},
        "architecture": {"name": arch, "raw_name": machine or None},
        "operating_system": operating_system,
        "environment": _environment(),
        "cpu": _cpu(),
        "memory": {"capacity_bytes": psutil.virtual_memory().total},
        "accelerators": _accelerators(reader),
    }
