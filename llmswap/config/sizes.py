"""Memory sizes written in a config: `6.5GB`, `6500MiB`, `512MB`, `24` (a bare number is in GB).

KB/MB/GB/TB are decimal (powers of 1000) and KiB/MiB/GiB/TiB binary (powers of 1024), as on
spec sheets and in `nvidia-smi` respectively; `B` is bytes. Units are case-insensitive and may be
separated from the number by a space. A bare number takes `default_unit` (GB unless a setting says
otherwise, e.g. `maxRequestBodySize` counts bytes).
"""

from __future__ import annotations

import re
from decimal import Decimal

UNITS: dict[str, int] = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")

ACCEPTED = "a size such as 6.5GB, 6500MiB, 512MB or 24 (GB); units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"


def parse_size(text: str | int | float, *, default_unit: str = "GB") -> int:
    """The number of bytes `text` names. Raises ValueError naming the input and the accepted forms."""
    if isinstance(text, bool):
        raise ValueError(f"expected {ACCEPTED}, got {text!r}")
    if isinstance(text, int | float):
        if text < 0 or text != text or text in (float("inf"), float("-inf")):
            raise ValueError(f"a size must be a non-negative number, got {text!r}")
        number, unit = Decimal(repr(text)), default_unit
    else:
        match = _SIZE.match(text)
        if not match:
            raise ValueError(f"expected {ACCEPTED}, got {text!r}")
        number = Decimal(match.group(1))
        unit = match.group(2) or default_unit
    multiplier = UNITS.get(unit.lower())
    if multiplier is None:
        raise ValueError(f"unknown unit {unit!r} in {text!r}; expected {ACCEPTED}")
    return int((number * multiplier).to_integral_value())
