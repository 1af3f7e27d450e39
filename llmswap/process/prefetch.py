"""A swap's `prefetch` phase: the next model's files read into the page cache while the last one drains.

At real sizes a start is mostly reading the weights: a model whose files are not in the page cache is read
from disk as the server loads it, after the victims have drained, saved their KV slots and stopped. Reading
the files the model's `cmd` names (the weights, a projector, a draft model: every argument that is an
existing regular file, `--flag=path` included) while that happens takes the read off the swap's critical
path. The read never delays the swap: the start does not wait for it, and when the start overtakes it the
server and the read share the same pages.

A file is skipped when it would not fit in the memory the host has available beyond a tenth of its total
(read from the host at that moment): reading it would only push out pages somebody uses, the victim's
among them while it still serves. The read runs in a thread (plain blocking reads: the kernel's
read-ahead does the rest) and stops between two chunks once cancelled: the swap was abandoned.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

log = logging.getLogger("llmswap.prefetch")

CHUNK = 8 << 20  # bytes per read: large enough for the disk, small enough to stop soon once cancelled
HEADROOM_FRACTION = 10  # a tenth of the host's memory is never filled by a prefetch

# The host's memory as a prefetch sees it: (available, total) bytes.
MemoryReading = Callable[[], tuple[int, int]]


def host_memory() -> tuple[int, int]:
    memory = psutil.virtual_memory()
    return memory.available, memory.total


def files_named(argv: Sequence[str], cwd: Path | None = None) -> list[Path]:
    """The existing regular files `argv`'s arguments name (the program itself is not one), each once, in
    order: `-m model.gguf` and `--model=model.gguf` alike."""
    base = cwd or Path.cwd()
    found: list[Path] = []
    for part in argv[1:]:
        for candidate in (part, part.partition("=")[2]):
            if not candidate:
                continue
            path = Path(candidate).expanduser()
            path = path if path.is_absolute() else base / path
            try:
                regular = path.is_file()
            except OSError:
                continue
            if regular and path not in found:
                found.append(path)
    return found


def room_for(size: int, available: int, total: int) -> bool:
    """Whether `size` bytes fit in the memory available beyond a tenth of the total."""
    return size <= available - total // HEADROOM_FRACTION


@dataclass(frozen=True)
class PrefetchReport:
    """What one prefetch did."""

    model: str
    read: tuple[str, ...] = ()  # files read whole
    bytes: int = 0
    skipped: tuple[str, ...] = ()  # "path: why", for each file left alone
    seconds: float = 0.0
    cancelled: bool = False


class Prefetch:
    """One model's files read into the page cache, in a worker thread; `cancel()` stops it soon."""

    def __init__(self, model: str, files: Sequence[Path], *, memory: MemoryReading = host_memory,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.model = model
        self.files = tuple(files)
        self._memory = memory
        self._clock = clock
        self._stop = threading.Event()

    def cancel(self) -> None:
        self._stop.set()

    async def run(self) -> PrefetchReport:
        """Read the files (in a thread); cancelling the awaiting task stops the read between two chunks."""
        try:
            return await asyncio.shield(asyncio.to_thread(self.read_all))
        except asyncio.CancelledError:
            self._stop.set()
            raise

    def read_all(self) -> PrefetchReport:
        """The blocking read (the worker thread's)."""
        began = self._clock()
        read: list[str] = []
        skipped: list[str] = []
        total_bytes = 0
        buffer = bytearray(CHUNK)
        for path in self.files:
            if self._stop.is_set():
                break
            try:
                size = path.stat().st_size
                available, total = self._memory()
                if not room_for(size, available, total):
                    skipped.append(f"{path}: {size >> 20} MiB would not fit in the {available >> 20} MiB "
                                   f"available beyond a tenth of the host's {total >> 20} MiB")
                    continue
                total_bytes += self._read(path, buffer)
            except OSError as exc:
                skipped.append(f"{path}: {exc.strerror or exc}")
                continue
            if not self._stop.is_set():
                read.append(str(path))
        report = PrefetchReport(self.model, tuple(read), total_bytes, tuple(skipped), self._clock() - began,
                                self._stop.is_set())
        for reason in skipped:
            log.info("[%s] prefetch: skipped %s", self.model, reason)
        return report

    def _read(self, path: Path, buffer: bytearray) -> int:
        done = 0
        view = memoryview(buffer)
        with path.open("rb", buffering=0) as file:
            os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            while not self._stop.is_set():
                count = file.readinto(view)
                if not count:
                    break
                done += count
        return done
