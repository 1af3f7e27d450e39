"""What a preempted attempt does to its task: it did not run, so the task goes back to its queue.

The router ends a task's request early when a request of higher priority needs the model's memory
(`routing.scheduler.settings.preemptBelow`); `acquire` raises `Preempted`. The attempt's answer, if any
came, is dropped: the row goes from running back to queued, with its preemption count one higher, in one
statement (`requeue_preempted`), keeping its `created_at`, so it sorts before every task queued after it
when the queue is loaded again (a restart); the lane that ran it puts it back at the head of its type's
queue in memory. A task preempted more than `tasks.maxPreemptions` times is failed instead, with an
error naming the count and the setting, so work that keeps losing its model cannot circle for ever.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmswap.tasks.queue.db import connect, notify, now_text
from llmswap.tasks.queue.sql import TaskDb


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


def requeue_preempted(
    db_path: TaskDb, task_id: int, max_preemptions: int, owner: str | None = None
) -> Requeue | None:
    """running -> queued (preemptions + 1), or -> failed once that passes `max_preemptions`; one statement.

    None when the row was no longer running (cancelled, failed by a restart, or, with `owner`, no longer
    under that lease): it is left as it is."""
    error = gave_up_error(max_preemptions + 1, max_preemptions)
    lease, lease_args = (" AND lease_owner = ?", (owner,)) if owner is not None else ("", ())
    with connect(db_path) as conn:
        record = conn.execute(
            "UPDATE background_tasks SET preemptions = preemptions + 1,"
            " status = CASE WHEN preemptions + 1 > ? THEN 'failed' ELSE 'queued' END,"
            " error = CASE WHEN preemptions + 1 > ? THEN ? ELSE NULL END, result = NULL,"
            " started_at = CASE WHEN preemptions + 1 > ? THEN started_at ELSE NULL END,"
            " finished_at = CASE WHEN preemptions + 1 > ? THEN ? ELSE NULL END,"
            " lease_owner = NULL, lease_until = NULL"
            f" WHERE id = ? AND status = 'running'{lease} RETURNING preemptions, status, task_type",
            (max_preemptions, max_preemptions, error, max_preemptions, max_preemptions, now_text(), task_id,
             *lease_args),
        ).fetchone()
        if record is None:
            return None
        count, status, task_type = int(record[0]), record[1], record[2]
        if status == "queued":
            notify(conn, db_path, task_type)
            return Requeue(count, requeued=True)
    return Requeue(count, requeued=False, error=error)
