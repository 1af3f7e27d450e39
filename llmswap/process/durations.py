"""Durations written the way Go's `time.Duration.String()` writes them (`15s`, `2m0s`, `1.5s`, `250ms`).

llama-swap's error texts embed durations in that form and clients may match on them, so llmswap keeps it.
"""

from __future__ import annotations

_NS_PER_US = 1_000
_NS_PER_MS = 1_000_000
_NS_PER_S = 1_000_000_000
_NS_PER_MIN = 60 * _NS_PER_S
_NS_PER_HOUR = 60 * _NS_PER_MIN


def format_go_duration(seconds: float) -> str:
    """`seconds` as Go prints a `time.Duration`: `0s`, `1.5ms`, `15s`, `2m0s`, `1h0m0s`."""
    ns = round(seconds * _NS_PER_S)
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < _NS_PER_US:
        return f"{sign}{ns}ns"
    if ns < _NS_PER_MS:
        return f"{sign}{_decimal(ns, _NS_PER_US)}µs"
    if ns < _NS_PER_S:
        return f"{sign}{_decimal(ns, _NS_PER_MS)}ms"
    hours, rest = divmod(ns, _NS_PER_HOUR)
    minutes, rest = divmod(rest, _NS_PER_MIN)
    text = sign
    if hours:
        text += f"{hours}h"
    if hours or minutes:
        text += f"{minutes}m"
    return f"{text}{_decimal(rest, _NS_PER_S)}s"


def _decimal(value: int, unit: int) -> str:
    """`value / unit` with no trailing zeros and no float rounding noise (`1500, 1000` -> `1.5`)."""
    whole, fraction = divmod(value, unit)
    if fraction == 0:
        return str(whole)
    digits = str(fraction).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"
