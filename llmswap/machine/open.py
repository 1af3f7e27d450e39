"""Choosing the reader for this machine: NVML when it works, host RAM otherwise."""

from __future__ import annotations

import logging
from typing import Any

from llmswap.machine.host import HostReader
from llmswap.machine.nvml import NvmlReader
from llmswap.machine.reader import MemoryReader

PREFERENCES = ("auto", "nvml", "host")


def open_reader(
    *, prefer: str = "auto", logger: logging.Logger | None = None, nvml: Any = None
) -> MemoryReader:
    """NVML when it initialises and sees at least one GPU, else host RAM.

    No NVIDIA driver is a normal machine, not an error: the fallback is said once, at info (at warning
    when `prefer="nvml"` asked for GPUs explicitly). `prefer="host"` skips NVML. `nvml` replaces the
    `pynvml` module (tests).
    """
    log = logger or logging.getLogger("llmswap.machine")
    if prefer not in PREFERENCES:
        raise ValueError(f"memory reader {prefer!r} is unknown: use one of {', '.join(PREFERENCES)}")
    if prefer == "host":
        return HostReader()
    reason = ""
    try:
        reader = NvmlReader(nvml)
    # NVML fails in many ways (no library, no driver, driver/library mismatch, no permission), each with
    # its own exception class: any of them means "no GPU readings here".
    except Exception as exc:
        reason = f"NVML is unavailable ({type(exc).__name__}: {exc})"
    else:
        if reader.devices():
            return reader
        reader.close()
        reason = "NVML sees no GPU"
    level = logging.WARNING if prefer == "nvml" else logging.DEBUG  # no GPU is the usual case without one
    log.log(level, "%s; measuring host RAM instead", reason)
    return HostReader()
