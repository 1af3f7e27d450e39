"""Peregrine's defaults for the task queue, and the checks on the settings that replace them.

Peregrine's three LLM task types and their VRAM budgets in decimal GB are *its* defaults: the synchronous
adapter (`get_scheduler`, `submit_task`) starts from them; the server mode takes its types and models from
the config's `tasks:` section instead.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from types import MappingProxyType

logger = logging.getLogger("llmswap.tasks.peregrine.scheduler")

LLM_TASK_TYPES: frozenset[str] = frozenset({"cover_letter", "company_research", "wizard_generate"})

DEFAULT_VRAM_BUDGETS: Mapping[str, float] = MappingProxyType(
    {
        "cover_letter": 2.5,  # a ~2 GB GGUF writer model plus headroom
        "company_research": 5.0,  # an 8B model
        "wizard_generate": 2.5,  # same model family as cover_letter
    }
)

DEFAULT_MAX_QUEUE_DEPTH = 500
UNLIMITED_VRAM_GB = 999.0  # CPU-only: nothing to budget, every type may run at once
BYTES_PER_GB = 10**9  # decimal, like `vram: 6.5GB` in the config


def detect_available_vram() -> float:
    """Total GPU memory in GB through `llmswap.machine` when it reads NVML; otherwise "unlimited" (CPU)."""
    try:
        gpu = importlib.import_module("llmswap.machine")
    except ImportError:
        return UNLIMITED_VRAM_GB
    open_reader = getattr(gpu, "open_reader", None)
    if open_reader is None:
        return UNLIMITED_VRAM_GB
    try:
        reader = open_reader()
    except Exception:
        logger.warning("could not read GPU memory; task budgets treat VRAM as unlimited", exc_info=True)
        return UNLIMITED_VRAM_GB
    try:
        if getattr(reader, "kind", None) != "nvml":
            return UNLIMITED_VRAM_GB
        total = sum(device.total for device in reader.devices())
    finally:
        close = getattr(reader, "close", None)
        if close is not None:
            close()
    return total / BYTES_PER_GB if total > 0 else UNLIMITED_VRAM_GB


def check_settings(max_queue_depth: int, available_vram: float | None) -> None:
    if max_queue_depth < 1:
        raise ValueError(f"max_queue_depth must be >= 1, got {max_queue_depth}")
    if available_vram is not None and available_vram <= 0:
        raise ValueError(f"available_vram must be > 0 GB (omit it to detect), got {available_vram}")


def merged_budgets(budgets: Mapping[str, float] | None) -> dict[str, float]:
    merged = {**DEFAULT_VRAM_BUDGETS, **(budgets or {})}
    for task_type, budget in merged.items():
        if budget < 0:
            raise ValueError(f"VRAM budget of task type {task_type!r} must be >= 0 GB, got {budget}")
    return merged
