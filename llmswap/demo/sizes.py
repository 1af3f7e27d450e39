"""Byte sizes for the demo's fake GPU flags: ``1073741824``, ``2GB``, ``512MiB``, ``1.5 GiB``.

The demo parses its own sizes so that it stays light and independent of the config package; the units
agree with the config's: KB/MB/GB/TB are decimal, KiB/MiB/GiB/TiB binary, and a bare number is bytes.
"""

import re
from decimal import Decimal

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")
_ACCEPTED = (
    "a number of bytes, or a number with a unit B, KB, MB, GB, TB, KiB, MiB, GiB, TiB (e.g. 2GB, 512MiB)"
)


def parse_size(text: str) -> int:
    """Return the number of bytes ``text`` names; raise ValueError saying what is accepted."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"size {text!r} is not {_ACCEPTED}")
    number, unit = match.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(f"size {text!r} has an unknown unit {unit!r}; expected {_ACCEPTED}")
    return int(Decimal(number) * factor)

