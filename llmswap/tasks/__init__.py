"""The Peregrine task-queue adapter: durable SQLite tasks, batched by type under VRAM budgets.

Usable from synchronous code (threads, no event loop):

    reset_running_tasks(db)                       # first: a crash's running rows -> failed
    get_scheduler(db, run_task_fn=make_run_task({"cover_letter": write_letter}))
    task_id, is_new = submit_task(db, "cover_letter", job_id=7, params={"messages": [...]})
"""

from llmswap.tasks.peregrine.runner import submit_task
from llmswap.tasks.peregrine.scheduler import (
    DEFAULT_VRAM_BUDGETS,
    LLM_TASK_TYPES,
    SchedulerSnapshot,
    TaskScheduler,
    current_scheduler,
    get_scheduler,
    reset_scheduler,
)
from llmswap.tasks.queue.db import (
    TaskDatabaseError,
    TaskRow,
    TaskStatus,
    cancel_task,
    get_task,
    init_db,
    insert_task,
    list_tasks,
    reset_running_tasks,
    task_stats,
    update_task_status,
)
from llmswap.tasks.queue.execution import Handler, RunTaskFn, default_run_task, make_run_task

__all__ = [
    "DEFAULT_VRAM_BUDGETS",
    "LLM_TASK_TYPES",
    "Handler",
    "RunTaskFn",
    "SchedulerSnapshot",
    "TaskDatabaseError",
    "TaskRow",
    "TaskScheduler",
    "TaskStatus",
    "cancel_task",
    "current_scheduler",
    "default_run_task",
    "get_scheduler",
    "get_task",
    "init_db",
    "insert_task",
    "list_tasks",
    "make_run_task",
    "reset_running_tasks",
    "reset_scheduler",
    "submit_task",
    "task_stats",
    "update_task_status",
]
