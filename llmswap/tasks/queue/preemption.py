"""What a preempted attempt does to its task: it did not run, so the task goes back to its queue.

The router ends a task's request early when a request of higher priority needs the model's memory
(`routing.scheduler.settings.preemptBelow`); `acquire` raises `Preempted`. The attempt's answer, if any
came, is dropped: the row goes from running back to queued, with its preemption count one higher, in one
transaction (`requeue_preempted`), keeping its `created_at`, so it sorts before every task queued after it
when the queue is loaded again (a restart); the lane that ran it puts it back at the head of its type's
queue in memory. A task preempted more than `tasks.maxPreemptions` times is failed instead, with an
error naming the count and the setting, so work that keeps losing its model cannot circle for ever.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmswap.tasks.queue.db import connect, now_text


def gave_up_error(preemptions: int, max_preemptions: int) -> str:
    return (
        f"preempted {preemptions} times by requests of higher priority (tasks.maxPreemptions: "
        f"{max_preemptions}); raise tasks.maxPreemptions, or routing.scheduler.settings.preemptBelow "
        f"no higher than tasks.priority, to let it finish"
    )


@dataclass(frozen=True, slots=True)
class Requeue:
    """What became of a preempted task's row."""

    preemptions: int  # the task's preemptions, this one included
    requeued: bool  # True: queued again; False: failed (`gave_up_error`)
    error: str | None = None


def requeue_preempted(db_path: Path | str, task_id: int, max_preemptions: int) -> Requeue | None:
    """running -> queued (preemptions + 1), or -> failed once that passes `max_preemptions`; one transaction.

    None when the row was no longer running (cancelled, or failed by a restart): it is left as it is.
    """
    with connect(db_path) as conn:
        conn.execute("BEGIN IMMEDIATE")
        try:
            record = conn.execute(
                "SELECT preemptions FROM background_tasks WHERE id = ? AND status = 'running'", (task_id,)
            ).fetchone()
            if record is None:
                conn.execute("COMMIT")
                return None
            count = int(record[0]) + 1
            if count > max_preemptions:
                outcome = Requeue(count, requeued=False, error=gave_up_error(count, max_preemptions))
                conn.execute(
                    "UPDATE background_tasks SET status = 'failed', preemptions = ?, error = ?,"
                    " result = NULL, finished_at = ? WHERE id = ?",
                    (count, outcome.error, now_text(), task_id),
                )
            else:
                outcome = Requeue(count, requeued=True)
                conn.execute(
                    "UPDATE background_tasks SET status = 'queued', preemptions = ?, error = NULL,"
                    " result = NULL, started_at = NULL, finished_at = NULL WHERE id = ?",
                    (count, task_id),
                )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    return outcome
