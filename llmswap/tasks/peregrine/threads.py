"""The thread one batch of the synchronous adapter runs its tasks on (`BATCH_THREAD_PREFIX` + type).

The engine's loop hands it one blocking task at a time and awaits the future `submit` returns; a task
that ends the thread (a BaseException) breaks the batch off with `LaneBroken`, and the lane starts anew.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable

from llmswap.tasks.queue.lanes import LaneBroken

BATCH_THREAD_PREFIX = "llmswap-tasks-batch-"


class BatchWorker(threading.Thread):
    """The thread one batch runs its tasks on; a task that kills it breaks the batch (`LaneBroken`)."""

    def __init__(self, task_type: str, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(name=f"{BATCH_THREAD_PREFIX}{task_type}", daemon=True)
        self._loop = loop
        self._inbox: queue.SimpleQueue[tuple[Callable[[], object], asyncio.Future[None]] | None] = (
            queue.SimpleQueue()
        )

    def submit(self, work: Callable[[], object]) -> asyncio.Future[None]:
        """Called on the loop: run `work` here; the future resolves when it is done."""
        done = self._loop.create_future()
        self._inbox.put((work, done))
        return done

    def retire(self) -> None:
        self._inbox.put(None)

    def run(self) -> None:
        while (job := self._inbox.get()) is not None:
            work, done = job
            try:
                work()
            except BaseException:
                # Not an Exception (run_queued_task catches those): the thread ends, the batch breaks off.
                self._settle(done, LaneBroken(f"{self.name} died"))
                raise
            self._settle(done, None)

    def _settle(self, done: asyncio.Future[None], error: BaseException | None) -> None:
        def settle() -> None:
            if not done.done():
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)

        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for this task any more
            self._loop.call_soon_threadsafe(settle)
