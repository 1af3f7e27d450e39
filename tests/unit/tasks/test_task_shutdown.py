"""Shutting the TaskScheduler down more than once: a later call waits for what an earlier one left running."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from llmswap.tasks.peregrine.scheduler import UNLIMITED_VRAM_GB, TaskScheduler
from tests.unit.tasks.helpers import WAIT, RecordingRunTask


class _LingeringLoopThread(TaskScheduler):
    """Its loop thread stays alive after the loop stopped until `leave` is set: the instant a first
    `shutdown` returns while the thread is still on its way out."""

    def __init__(self, db: Path) -> None:
        super().__init__(db, RecordingRunTask(), available_vram=UNLIMITED_VRAM_GB)
        self.leave = threading.Event()

    def _serve(self) -> None:
        super()._serve()
        assert self.leave.wait(WAIT)


def test_second_shutdown_waits_for_the_loop_thread_the_first_left_running(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = _LingeringLoopThread(db)
    scheduler.start()
    loop_thread = scheduler._loop_thread
    assert loop_thread is not None

    assert not scheduler.shutdown(timeout=0)  # the loop stopped, its thread has not ended yet
    assert loop_thread.is_alive()

    # The thread may leave only once someone waits for it: a shutdown that does not wait sees it alive.
    join = loop_thread.join

    def join_and_let_go(timeout: float | None = None) -> None:
        scheduler.leave.set()
        join(timeout)

    monkeypatch.setattr(loop_thread, "join", join_and_let_go)
    assert scheduler.shutdown(timeout=WAIT)
    assert not loop_thread.is_alive()
