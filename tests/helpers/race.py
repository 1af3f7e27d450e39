"""Run one piece of work on several threads released at the same instant (a barrier), for tests of code that
must stay correct when called concurrently."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def all_at_once(work: Callable[[], T], threads: int, wait: float) -> list[T]:
    """What `work` returned on each of `threads` threads that start it together (in the order they finished);
    each waits at most `wait` seconds for the others to be ready and to finish."""
    start_together = threading.Barrier(threads)
    results: list[T] = []
    lock = threading.Lock()

    def run() -> None:
        start_together.wait(wait)
        result = work()
        with lock:
            results.append(result)

    started = [threading.Thread(target=run) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(wait)
    return results
