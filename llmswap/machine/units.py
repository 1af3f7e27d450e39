"""Byte counts in the units people read on `nvidia-smi` and in messages: binary, one decimal."""

from __future__ import annotations

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB

_UNITS = ((TiB, "TiB"), (GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB"))


def format_bytes(n: int | float) -> str:
    """`30.0 GiB`, `512.0 MiB`, `100 B`; negative values keep their sign."""
    sign = "-" if n < 0 else ""
    size = abs(n)
    for factor, unit in _UNITS:
        if size >= factor:
            return f"{sign}{size / factor:.1f} {unit}"
    return f"{sign}{int(size)} B"
