"""Waiting for memory to come back after an eviction.

A stopped process's memory is not free the instant it exits: the driver tears the context down
afterwards. Ollama polls every 250 ms for up to 5 s before loading the next model; llmswap polls
faster, because the wait is part of every swap the user sits through.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from llmswap.machine.reader import MemoryReader


# `timeout` is a parameter, not `asyncio.timeout` around the call, because running out of time is an
# outcome to report here, not an exception.
async def wait_for_free(
    reader: MemoryReader,
    need: Mapping[int, int],
    *,
    timeout: float = 5.0,
    interval: float = 0.05,
) -> float:
    """Poll until every device `d` in `need` has at least `need[d]` bytes free, or `timeout` passes.

    Returns the seconds waited either way: timing out is not an error here (the start that follows
    may still succeed, and an out-of-memory failure has its own recovery), so the caller compares the
    result with `timeout` to know and log it. A device the reader does not have is not waited for:
    there is nothing to observe.
    """
    start = time.monotonic()
    while True:
        free = {d.index: d.free for d in reader.devices()}
        if all(free.get(device, size) >= size for device, size in need.items()):
            return time.monotonic() - start
        waited = time.monotonic() - start
        if waited >= timeout:
            return waited
        await asyncio.sleep(min(interval, timeout - waited))
