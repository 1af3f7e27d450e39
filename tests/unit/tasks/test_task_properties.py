"""Property: any sequence of submits, cancels and in-process restarts loses no task and runs none twice.

A restart is what a restarting server does: stop the scheduler, `reset_running_tasks`, build a new one.
Handlers can be held mid-task (`hold`/`release`), so restarts also happen while tasks run and while
tasks wait in the deques; the old scheduler is not waited for, so its held worker wakes up later next
to the new scheduler — harsher than a real restart, where the old process is gone. Every task must end
completed or failed exactly once (an SQLite trigger records every write of a final status) and its
handler must run at most once.
"""

from __future__ import annotations

import sqlite3
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from llmswap.tasks.peregrine.runner import submit_task
from llmswap.tasks.peregrine.scheduler import LLM_TASK_TYPES, TaskScheduler, get_scheduler, reset_scheduler
from llmswap.tasks.queue.db import (
    CANCELLED_ERROR,
    INTERRUPTED_ERROR,
    QUEUE_FULL_ERROR,
    TaskRow,
    TaskStatus,
    cancel_task,
    init_db,
    list_tasks,
    reset_running_tasks,
)
from llmswap.tasks.queue.execution import make_run_task
from tests.unit.tasks.helpers import WAIT, wait_until

TASK_TYPES = ("cover_letter", "company_research", "wizard_generate", "discovery")
FAILING_JOB = 3
HANDLER_ERROR = f"RuntimeError: job {FAILING_JOB} fails"
MAX_QUEUE_DEPTH = 1  # tiny, so drops happen too

_AUDIT = """
CREATE TABLE final_writes (task_id INTEGER NOT NULL, status TEXT NOT NULL);
CREATE TRIGGER record_final_write AFTER UPDATE OF status ON background_tasks
WHEN NEW.status IN ('completed', 'failed')
BEGIN
    INSERT INTO final_writes (task_id, status) VALUES (NEW.id, NEW.status);
END;
"""

operations = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.sampled_from(TASK_TYPES), st.integers(0, FAILING_JOB)),
        st.tuples(st.just("cancel"), st.integers(0, 30)),
        st.tuples(st.just("restart")),
        st.tuples(st.just("hold")),
        st.tuples(st.just("release")),
    ),
    max_size=25,
)


@dataclass
class History:
    """What the test did and what the handler saw, shared with worker threads."""

    submitted: dict[int, tuple[str, int]] = field(default_factory=dict)
    cancelled: set[int] = field(default_factory=set)
    runs: Counter[int] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    gate: threading.Event = field(default_factory=threading.Event)  # set = handlers may finish

    def handler(self, row: TaskRow) -> str:
        with self.lock:
            self.runs[row.id] += 1
        assert self.gate.wait(WAIT)
        if row.job_id == FAILING_JOB:
            raise RuntimeError(f"job {FAILING_JOB} fails")
        return f"ok-{row.id}"


def _boot(db: Path, history: History) -> TaskScheduler:
    reset_running_tasks(db)
    return get_scheduler(
        db, make_run_task(fallback=history.handler), available_vram=5.0, max_queue_depth=MAX_QUEUE_DEPTH
    )


def _play(db: Path, ops: list[tuple], history: History) -> None:
    history.gate.set()
    scheduler = _boot(db, history)
    stopped: list[TaskScheduler] = []
    for op in ops:
        if op[0] == "submit":
            _, task_type, job_id = op
            task_id, is_new = submit_task(db, task_type, job_id=job_id, params={"job": job_id})
            if is_new:
                assert task_id not in history.submitted
                history.submitted[task_id] = (task_type, job_id)
            else:
                assert history.submitted[task_id] == (task_type, job_id)
        elif op[0] == "cancel" and history.submitted:
            ids = sorted(history.submitted)
            task_id = ids[op[1] % len(ids)]
            if cancel_task(db, task_id):
                scheduler.discard(task_id)
                history.cancelled.add(task_id)
        elif op[0] == "restart":
            stopped.append(scheduler)
            reset_scheduler(timeout=0)
            scheduler = _boot(db, history)
        elif op[0] == "hold":
            history.gate.clear()
        elif op[0] == "release":
            history.gate.set()
    history.gate.set()
    for old in stopped:
        assert old.shutdown(WAIT)
    assert scheduler.wait_idle(WAIT)
    # free threads of non-LLM tasks are nobody's to join: wait for their rows
    assert wait_until(lambda: not list_tasks(db, status="queued") and not list_tasks(db, status="running"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_submit_cancel_restart_never_loses_or_repeats_a_task(ops: list[tuple]) -> None:
    history = History()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "tasks.sqlite"
        init_db(db)
        with sqlite3.connect(db) as conn:
            conn.executescript(_AUDIT)
        reset_scheduler()
        try:
            _play(db, ops, history)
        finally:
            reset_scheduler()
        rows = {row.id: row for row in list_tasks(db, limit=1000)}
        with sqlite3.connect(db) as conn:
            final_writes = Counter(task_id for (task_id,) in conn.execute("SELECT task_id FROM final_writes"))

    assert set(rows) == set(history.submitted)  # nothing lost, nothing invented
    for task_id, row in rows.items():
        event(f"outcome: {row.error or row.status.value}")  # --hypothesis-show-statistics
        runs = history.runs[task_id]
        assert row.finished, row
        assert final_writes[task_id] == 1, row  # ended exactly once
        assert runs <= 1, row  # never run twice
        if row.status is TaskStatus.COMPLETED:
            assert (runs, row.result) == (1, f"ok-{task_id}"), row
        elif row.error == CANCELLED_ERROR:
            assert task_id in history.cancelled and runs == 0, row
        elif row.error == QUEUE_FULL_ERROR:
            assert row.task_type in LLM_TASK_TYPES and runs == 0, row
        elif row.error == HANDLER_ERROR:
            assert row.job_id == FAILING_JOB and runs == 1, row
        else:
            assert row.error == INTERRUPTED_ERROR, row
    assert history.cancelled <= set(rows)
