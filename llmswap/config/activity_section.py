"""`metricsMaxInMemory`, `captureBuffer`, `store:` and `performance:`: what llmswap records about requests
and the machine (llama-swap's keys, defaults and checks).

`store.path` is checked here as llama-swap checks it (not blank, not a directory, writable or creatable);
an existing file that is not a database is found when the store opens, and reported then (serving goes
on with activity in memory). Relative paths are taken from the config file's directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from llmswap.config import keys
from llmswap.config.fields import Fields
from llmswap.config.model import ActivityConfig, PerformanceConfig
from llmswap.config.tasks_section import resolve_path

STORE_KEYS = keys.STORE  # the keys the loader accepts here (llmswap.config.keys)
PERFORMANCE_KEYS = keys.PERFORMANCE  # the keys the loader accepts here (llmswap.config.keys)
MIN_EVERY = 5.0
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """A Go duration string (`15s`, `1m30s`, `0`) in seconds; ValueError naming the accepted form."""
    raw = text.strip()
    if raw == "0":
        return 0.0
    position, total = 0, 0.0
    while position < len(raw):
        match = _DURATION_PART.match(raw, position)
        if match is None:
            raise ValueError(f"must be a duration such as 5s, 1m or 1m30s, got {text!r}")
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    if not raw:
        raise ValueError("must be a duration such as 5s, 1m or 1m30s, got an empty value")
    return total


def read_activity(root: Fields, base_dir: Path) -> ActivityConfig:
    defaults = ActivityConfig()
    max_rows = root.integer("metricsMaxInMemory", defaults.max_in_memory)
    capture_mb = root.number("captureBuffer", defaults.capture_mb,
                             what="a size in MiB (0 turns captures off)")
    store_path: Path | None = None
    retention = defaults.store_retention
    if "store" in root.map.entries:
        store = root.mapping("store", "a mapping with path: (and retention:)")
        store.warn_unknown(keys.STORE)
        text = store.text("path").strip()
        if not text:
            store.error("path" if store.has("path") else None,
                        "store.path must not be empty; give a file for the activity database")
        else:
            store_path = resolve_path(text, base_dir)
            problem = _store_problem(store_path)
            if problem:
                store.error("path", f"store.path: {problem}")
                store_path = None
        retention = store.integer("retention", defaults.store_retention, minimum=0,
                                  what="a number of rows to keep (0 = keep all)")
    return ActivityConfig(max_in_memory=max_rows if max_rows > 0 else defaults.max_in_memory,
                          capture_mb=max(capture_mb, 0.0), store_path=store_path, store_retention=retention)


def _store_problem(path: Path) -> str:
    if path.is_dir():
        return f"{path} is a directory, not a file; name a file inside it"
    if path.exists():
        return "" if os.access(path, os.W_OK) else f"{path} is not writable; fix its permissions"
    parent = path.parent
    if not parent.is_dir():
        return f"directory {parent} does not exist; create it"
    return "" if os.access(parent, os.W_OK) else f"directory {parent} is not writable; fix its permissions"


def read_performance(root: Fields) -> PerformanceConfig:
    defaults = PerformanceConfig()
    if "performance" not in root.map.entries:
        return defaults
    fields = root.mapping("performance", "a mapping with disabled: and every:")
    fields.warn_unknown(keys.PERFORMANCE)
    every = defaults.every
    if fields.has("every"):
        try:
            every = parse_duration(fields.text("every")) or defaults.every
        except ValueError as exc:
            fields.error("every", str(exc))
        if every < MIN_EVERY:
            shown = fields.text("every").strip()
            fields.error("every", f"performance: every must be at least 5s, got {shown}")
            every = defaults.every
    return PerformanceConfig(disabled=fields.flag("disabled", False), every=every)
