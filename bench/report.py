"""The one table `python -m bench` prints: rows of a baseline and llmswap measured in the same run, and the
machine they ran on."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

COLUMNS = ("measure", "baseline, same run", "baseline", "llmswap", "llmswap / baseline")


@dataclass(frozen=True)
class Row:
    """One measure: what the baseline is, both values already formatted, and their ratio."""

    measure: str
    against: str  # what the baseline is: "direct to the upstream", "llama-swap's schedule"...
    baseline: str
    llmswap: str
    ratio: str

    @classmethod
    def skipped(cls, measure: str, reason: str) -> Row:
        return cls(measure, f"skipped: {reason}", "", "", "")


def ratio(value: float, baseline: float) -> str:
    """`value / baseline` as `x0.97`, with enough digits for ratios far below 1."""
    if baseline == 0:
        return "n/a (zero baseline)"
    fraction = value / baseline
    if fraction == 0:
        return "x0"
    digits = 2 if fraction >= 0.1 else 3 if fraction >= 0.01 else 4
    return f"x{fraction:.{digits}f}"


def ms(seconds: float) -> str:
    milliseconds = seconds * 1000
    digits = 2 if milliseconds < 10 else 1 if milliseconds < 100 else 0
    return f"{milliseconds:.{digits}f} ms"


def per_second(value: float, unit: str) -> str:
    return f"{value:,.0f} {unit}/s" if value >= 100 else f"{value:.1f} {unit}/s"


def mib(size: float) -> str:
    return f"{size / 2**20:.1f} MiB"


def markdown_table(rows: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|---|---|---:|---:|---:|"]
    lines += [f"| {r.measure} | {r.against} | {r.baseline} | {r.llmswap} | {r.ratio} |" for r in rows]
    return "\n".join(lines)


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, where Linux has one."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine(versions: Iterable[tuple[str, str]] = ()) -> str:
    """One line naming the machine: CPU, cores, OS, Python and the given library versions."""
    parts = [f"{cpu_model()}, {os.cpu_count()} cores", f"{platform.system()} {platform.release()}",
             f"Python {platform.python_version()}", *(f"{name} {version}" for name, version in versions)]
    return "; ".join(parts)


def print_report(rows: Sequence[Row], command: str, began: float) -> None:
    """A benchmark's output: its table, the machine, and the command with how long it took (`began`: its
    `time.monotonic()` at the start)."""
    print(markdown_table(rows))
    print()
    print(machine())
    print(f"\n`{command}` took {time.monotonic() - began:.0f} s")
