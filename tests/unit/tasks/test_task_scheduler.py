"""The TaskScheduler against the seed's test table, plus the edges the server mode relies on.

`run_task` is a recording stand-in (no model behind it); the database is a real SQLite file.
Threads synchronise through events and barriers inside the stand-in; waits have generous bounds.
"""

from __future__ import annotations

import logging
import sqlite3
import sys
import threading
import types
from pathlib import Path

import pytest

import llmswap.tasks.peregrine.scheduler as scheduler_module
from llmswap.tasks.peregrine.runner import FREE_THREAD_PREFIX, submit_task
from llmswap.tasks.peregrine.scheduler import (
    BATCH_THREAD_PREFIX,
    DEFAULT_VRAM_BUDGETS,
    LLM_TASK_TYPES,
    LOOP_THREAD_NAME,
    UNLIMITED_VRAM_GB,
    TaskScheduler,
    current_scheduler,
    detect_available_vram,
    get_scheduler,
    reset_scheduler,
)
from llmswap.tasks.queue.db import (
    CANCELLED_ERROR,
    INTERRUPTED_ERROR,
    QUEUE_FULL_ERROR,
    TaskStatus,
    cancel_task,
    claim_task,
    get_task,
    insert_task,
    reset_running_tasks,
    update_task_status,
)
from tests.helpers.race import all_at_once
from tests.unit.tasks.helpers import (
    WAIT,
    Call,
    RecordingRunTask,
    SchedulerFactory,
    queue_task,
    scheduler_threads_alive,
)

# Default budgets: cover_letter 2.5 GB, company_research 5.0 GB, wizard_generate 2.5 GB.
ONE_MODEL_VRAM = 5.0  # fits either cover_letter or company_research, never both
BOTH_MODELS_VRAM = 7.5


# -- the seed's table -------------------------------------------------------------------------------


def test_deepest_queue_wins_first_slot(make_scheduler: SchedulerFactory) -> None:
    active_during: dict[str, set[tuple[str, ...]]] = {"cover_letter": set(), "company_research": set()}

    def note_active(call: Call) -> None:
        active_during[call.task_type].add(scheduler.snapshot().active_types)

    run_task = RecordingRunTask(note_active)
    scheduler = make_scheduler(run_task, available_vram=ONE_MODEL_VRAM)
    # research arrives first, but cover_letter's queue is deeper: depth, not arrival, wins the slot
    for _ in range(2):
        queue_task(scheduler, "company_research")
    for _ in range(3):
        queue_task(scheduler, "cover_letter")

    scheduler.start()
    assert scheduler.wait_idle(WAIT)

    assert run_task.types() == ["cover_letter"] * 3 + ["company_research"] * 2
    assert active_during == {"cover_letter": {("cover_letter",)}, "company_research": {("company_research",)}}
    assert dict(scheduler.snapshot().batches_started) == {"cover_letter": 1, "company_research": 1}


def test_fifo_within_type(make_scheduler: SchedulerFactory, run_task: RecordingRunTask) -> None:
    scheduler = make_scheduler(run_task, available_vram=BOTH_MODELS_VRAM)
    expected: dict[str, list[int]] = {"cover_letter": [], "wizard_generate": []}
    for i in range(6):
        task_type = "cover_letter" if i % 2 == 0 else "wizard_generate"
        expected[task_type].append(queue_task(scheduler, task_type, job_id=100 + i))

    scheduler.start()
    assert scheduler.wait_idle(WAIT)

    assert run_task.ids("cover_letter") == expected["cover_letter"]
    assert run_task.ids("wizard_generate") == expected["wizard_generate"]


def test_concurrent_batches_when_vram_allows(make_scheduler: SchedulerFactory) -> None:
    # Both workers and this test meet at `inside`: it can only be passed if both batches run at once.
    inside = threading.Barrier(3)
    leave = threading.Barrier(3)

    def meet(call: Call) -> None:
        inside.wait(WAIT)
        leave.wait(WAIT)

    run_task = RecordingRunTask(meet)
    scheduler = make_scheduler(run_task, available_vram=BOTH_MODELS_VRAM)
    queue_task(scheduler, "cover_letter")
    queue_task(scheduler, "company_research")
    scheduler.start()

    inside.wait(WAIT)
    snapshot = scheduler.snapshot()
    leave.wait(WAIT)

    assert snapshot.active_types == ("company_research", "cover_letter")
    assert snapshot.reserved_vram == BOTH_MODELS_VRAM
    assert scheduler.wait_idle(WAIT)
    assert sorted(run_task.types()) == ["company_research", "cover_letter"]


def test_new_tasks_picked_up_mid_batch(make_scheduler: SchedulerFactory) -> None:
    first_running = threading.Event()
    release_first = threading.Event()

    def hold_first(call: Call) -> None:
        if call.task_id == first:
            first_running.set()
            assert release_first.wait(WAIT)

    run_task = RecordingRunTask(hold_first)
    scheduler = make_scheduler(run_task, available_vram=ONE_MODEL_VRAM)
    # Queued before start: a started scheduler may run a task before `enqueue` returns its id to us.
    first = queue_task(scheduler, "cover_letter")
    scheduler.start()
    assert first_running.wait(WAIT)

    later = [queue_task(scheduler, "cover_letter") for _ in range(2)]
    release_first.set()
    assert scheduler.wait_idle(WAIT)

    assert run_task.ids() == [first, *later]
    assert len({id(c.thread) for c in run_task.calls}) == 1  # one worker ran all three: one batch
    assert scheduler.snapshot().batches_started["cover_letter"] == 1


def test_reconfigure_changes_types_and_budgets_without_stopping_a_batch(
    make_scheduler: SchedulerFactory, db: Path
) -> None:
    held = threading.Event()
    release = threading.Event()

    def hold_letters(call: Call) -> None:
        if call.task_type == "cover_letter":
            held.set()
            assert release.wait(WAIT)

    run_task = RecordingRunTask(hold_letters)
    scheduler = make_scheduler(run_task, llm_task_types={"cover_letter", "company_research"},
                               available_vram=ONE_MODEL_VRAM)
    letters = [queue_task(scheduler, "cover_letter") for _ in range(2)]  # the deeper queue goes first
    research = [queue_task(scheduler, "company_research")]
    wizard, _ = insert_task(db, "wizard_generate", 0, None, dedupe=False)  # not a type of this scheduler
    scheduler.start()
    assert held.wait(WAIT)
    assert scheduler.pending_ids("company_research") == tuple(research)  # waits: no room beside letters

    # Research leaves, the wizard comes in, and there is room for two batches now.
    scheduler.reconfigure(llm_task_types={"cover_letter", "wizard_generate"}, available_vram=BOTH_MODELS_VRAM)
    assert run_task.wait_for_calls(2)  # the wizard ran beside the letter still being written
    assert run_task.ids() == [letters[0], wizard]
    assert scheduler.pending_ids("company_research") == ()
    release.set()
    assert scheduler.wait_idle(WAIT)
    assert run_task.ids("cover_letter") == letters  # the running batch went on with its queue
    assert get_task(db, research[0]).status is TaskStatus.QUEUED  # kept for a later config
    with pytest.raises(ValueError, match="not an LLM task type"):
        scheduler.enqueue(research[0], "company_research", 0)


def test_worker_crash_releases_vram(make_scheduler: SchedulerFactory, db: Path) -> None:
    reserved_while_running: list[float] = []
    crashing: list[int] = []

    def crash_first(call: Call) -> None:
        reserved_while_running.append(scheduler.reserved_vram)
        if call.task_id in crashing:
            raise RuntimeError("model server went away")

    run_task = RecordingRunTask(crash_first)
    scheduler = make_scheduler(run_task, available_vram=ONE_MODEL_VRAM)
    crashing.append(queue_task(scheduler, "cover_letter"))
    survivor = queue_task(scheduler, "cover_letter")
    scheduler.start()
    assert scheduler.wait_idle(WAIT)

    assert scheduler.reserved_vram == 0.0
    assert reserved_while_running == [2.5, 2.5]
    crashed = get_task(db, crashing[0])
    assert crashed is not None and crashed.status is TaskStatus.FAILED
    assert crashed.error == "RuntimeError: model server went away"
    assert run_task.ids() == [crashing[0], survivor]

    # the scheduler carries on, and the budget was released once, not twice
    after = queue_task(scheduler, "company_research")
    assert scheduler.wait_idle(WAIT)
    assert run_task.ids()[-1] == after
    assert reserved_while_running[-1] == 5.0
    assert scheduler.reserved_vram == 0.0


def test_non_llm_tasks_bypass_scheduler(db: Path, run_task: RecordingRunTask) -> None:
    scheduler = get_scheduler(db, run_task, available_vram=ONE_MODEL_VRAM)

    discovery_id, discovery_new = submit_task(db, "discovery")
    email_id, email_new = submit_task(db, "email_sync", job_id=3, params={"folder": "inbox"})
    assert discovery_new and email_new
    assert run_task.wait_for_calls(2)

    by_id = {c.task_id: c for c in run_task.calls}
    assert by_id[discovery_id].thread.name == f"{FREE_THREAD_PREFIX}{discovery_id}"
    assert by_id[email_id].thread.name == f"{FREE_THREAD_PREFIX}{email_id}"
    assert (by_id[email_id].job_id, by_id[email_id].params) == (3, {"folder": "inbox"})
    snapshot = scheduler.snapshot()
    assert dict(snapshot.queue_depths) == {}
    assert dict(snapshot.batches_started) == {}
    assert scheduler.pending_ids("discovery") == () and scheduler.pending_ids("email_sync") == ()

    # while an LLM type submitted the same way goes through a batch worker
    letter_id, _ = submit_task(db, "cover_letter", job_id=9)
    assert run_task.wait_for_calls(3)
    assert scheduler.wait_idle(WAIT)
    letter = next(c for c in run_task.calls if c.task_id == letter_id)
    assert letter.thread.name == f"{BATCH_THREAD_PREFIX}cover_letter"


def test_durability_llm_tasks_on_startup(
    make_scheduler: SchedulerFactory, db: Path, run_task: RecordingRunTask
) -> None:
    letter_a, _ = insert_task(db, "cover_letter", 1)
    research, _ = insert_task(db, "company_research", 2, params={"company": "Acme"})
    letter_b, _ = insert_task(db, "cover_letter", 3)
    wizard, _ = insert_task(db, "wizard_generate", 4)
    finished, _ = insert_task(db, "cover_letter", 5)
    update_task_status(db, finished, "completed", result="done")
    # created_at decides the order, not the id: make letter_b the older one
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE background_tasks SET created_at = '2000-01-01 00:00:00.000000' WHERE id = ?", (letter_b,)
        )

    scheduler = make_scheduler(run_task, available_vram=UNLIMITED_VRAM_GB)

    assert scheduler.pending_ids("cover_letter") == (letter_b, letter_a)
    assert scheduler.pending_ids("company_research") == (research,)
    assert scheduler.pending_ids("wizard_generate") == (wizard,)
    scheduler.start()
    assert scheduler.wait_idle(WAIT)
    assert run_task.ids("cover_letter") == [letter_b, letter_a]
    assert next(c.params for c in run_task.calls if c.task_id == research) == {"company": "Acme"}
    assert finished not in run_task.ids()


def test_durability_excludes_non_llm(
    make_scheduler: SchedulerFactory, db: Path, run_task: RecordingRunTask
) -> None:
    insert_task(db, "discovery", 0)
    insert_task(db, "scrape_url", 7)
    letter, _ = insert_task(db, "cover_letter", 1)

    scheduler = make_scheduler(run_task, available_vram=UNLIMITED_VRAM_GB)

    assert dict(scheduler.snapshot().queue_depths) == {"cover_letter": 1}
    assert scheduler.pending_ids("discovery") == () and scheduler.pending_ids("scrape_url") == ()
    assert scheduler.pending_ids("cover_letter") == (letter,)


def test_running_rows_reset_before_scheduler(
    make_scheduler: SchedulerFactory, db: Path, run_task: RecordingRunTask
) -> None:
    interrupted, _ = insert_task(db, "cover_letter", 1)
    waiting, _ = insert_task(db, "cover_letter", 2)
    done, _ = insert_task(db, "company_research", 3)
    assert claim_task(db, interrupted) is not None
    update_task_status(db, done, "completed", result="ok")

    assert reset_running_tasks(db) == 1

    failed = get_task(db, interrupted)
    assert failed is not None and failed.status is TaskStatus.FAILED
    assert failed.error == INTERRUPTED_ERROR and failed.finished_at is not None
    queued = get_task(db, waiting)
    assert queued is not None and queued.status is TaskStatus.QUEUED
    assert (queued.error, queued.started_at, queued.finished_at) == (None, None, None)
    completed = get_task(db, done)
    assert completed is not None and (completed.status, completed.result) == (TaskStatus.COMPLETED, "ok")
    # the scheduler built afterwards resumes the queued row only: nothing is run twice
    scheduler = make_scheduler(run_task, available_vram=UNLIMITED_VRAM_GB)
    assert scheduler.pending_ids("cover_letter") == (waiting,)


def test_max_queue_depth_marks_failed(
    make_scheduler: SchedulerFactory,
    db: Path, run_task: RecordingRunTask, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = make_scheduler(run_task, available_vram=UNLIMITED_VRAM_GB, max_queue_depth=2)
    kept = [queue_task(scheduler, "cover_letter") for _ in range(2)]
    dropped_id, _ = insert_task(db, "cover_letter", 0, dedupe=False)

    with caplog.at_level(logging.WARNING, logger=scheduler_module.__name__):
        accepted = scheduler.enqueue(dropped_id, "cover_letter", 0, None)

    assert not accepted
    assert f"Queue depth limit reached for cover_letter (max=2) — task {dropped_id} dropped" in caplog.text
    assert scheduler.pending_ids("cover_letter") == tuple(kept)
    dropped = get_task(db, dropped_id)
    assert dropped is not None and dropped.status is TaskStatus.FAILED
    assert dropped.error == QUEUE_FULL_ERROR
    # the limit is per type: another type still has room
    assert queue_task(scheduler, "company_research") in scheduler.pending_ids("company_research")
    # work whose size was bounded before (a batch file's requests) is not held to it
    unbounded_id, _ = insert_task(db, "cover_letter", 0, dedupe=False)
    assert scheduler.enqueue(unbounded_id, "cover_letter", 0, None, bounded=False)
    assert scheduler.pending_ids("cover_letter") == (*kept, unbounded_id)


def test_missing_budget_logs_warning(
    make_scheduler: SchedulerFactory, run_task: RecordingRunTask, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=scheduler_module.__name__):
        scheduler = make_scheduler(
            run_task, llm_task_types={*LLM_TASK_TYPES, "translate"}, available_vram=UNLIMITED_VRAM_GB
        )

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "No VRAM budget defined for LLM task type 'translate'" in warnings[0]
    assert "defaulting to 0.0 GB" in warnings[0]
    assert "translate" not in scheduler.budgets

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=scheduler_module.__name__):
        configured = make_scheduler(
            run_task,
            llm_task_types={*LLM_TASK_TYPES, "translate"},
            budgets={"translate": 1.5, "cover_letter": 3.0},
            available_vram=UNLIMITED_VRAM_GB,
        )
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    assert dict(configured.budgets) == {**DEFAULT_VRAM_BUDGETS, "translate": 1.5, "cover_letter": 3.0}


def test_singleton_thread_safe(db: Path, run_task: RecordingRunTask, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[TaskScheduler] = []

    class CountingScheduler(TaskScheduler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            built.append(self)

    monkeypatch.setattr(scheduler_module, "TaskScheduler", CountingScheduler)
    callers = 8
    results = all_at_once(lambda: get_scheduler(db, run_task, available_vram=UNLIMITED_VRAM_GB), callers,
                          WAIT)

    assert len(results) == callers
    assert len(built) == 1
    assert all(s is built[0] for s in results)
    assert [name for name in scheduler_threads_alive() if name == LOOP_THREAD_NAME] == [LOOP_THREAD_NAME]


def test_reset_scheduler_cleans_up(db: Path, run_task: RecordingRunTask) -> None:
    scheduler = get_scheduler(db, run_task, available_vram=BOTH_MODELS_VRAM)
    submit_task(db, "cover_letter", job_id=1)
    submit_task(db, "company_research", job_id=2)
    assert run_task.wait_for_calls(2)
    assert LOOP_THREAD_NAME in scheduler_threads_alive()

    reset_scheduler()

    assert scheduler_threads_alive() == []
    assert scheduler.stopped
    assert current_scheduler() is None
    fresh = get_scheduler(db, run_task, available_vram=BOTH_MODELS_VRAM)
    assert fresh is not scheduler and not fresh.stopped


# -- beyond the table: what the server mode and restarts rely on ------------------------------------


class _WorkerKilled(BaseException):
    """Not an Exception: nothing in the worker catches it, so it ends the thread and only `finally` runs."""


def test_worker_thread_death_releases_budget_and_batch_resumes(
    make_scheduler: SchedulerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    deaths: list[tuple[type[BaseException] | None, str | None]] = []

    def record_death(hook: threading.ExceptHookArgs) -> None:
        deaths.append((hook.exc_type, getattr(hook.thread, "name", None)))

    monkeypatch.setattr(threading, "excepthook", record_death)
    dying: list[int] = []

    def die_on_first(call: Call) -> None:
        if call.task_id in dying:
            raise _WorkerKilled

    run_task = RecordingRunTask(die_on_first)
    scheduler = make_scheduler(run_task, available_vram=ONE_MODEL_VRAM)
    dying.append(queue_task(scheduler, "cover_letter"))
    rest = [queue_task(scheduler, "cover_letter") for _ in range(2)]
    scheduler.start()
    assert scheduler.wait_idle(WAIT)

    assert run_task.ids() == [dying[0], *rest]
    assert deaths == [(_WorkerKilled, f"{BATCH_THREAD_PREFIX}cover_letter")]
    assert scheduler.snapshot().batches_started["cover_letter"] == 2
    assert scheduler.reserved_vram == 0.0


def test_cancelled_task_is_skipped_by_the_worker(make_scheduler: SchedulerFactory, db: Path) -> None:
    holding = threading.Event()
    release = threading.Event()

    def hold_first(call: Call) -> None:
        if call.task_id == first:
            holding.set()
            assert release.wait(WAIT)

    run_task = RecordingRunTask(hold_first)
    scheduler = make_scheduler(run_task, available_vram=UNLIMITED_VRAM_GB)
    first = queue_task(scheduler, "cover_letter")  # before start: the hook must know its id when it runs
    scheduler.start()
    assert holding.wait(WAIT)
    cancelled_in_db_only = queue_task(scheduler, "cover_letter")
    cancelled_and_discarded = queue_task(scheduler, "cover_letter")
    kept = queue_task(scheduler, "cover_letter")

    assert cancel_task(db, cancelled_in_db_only)
    assert cancel_task(db, cancelled_and_discarded) and scheduler.discard(cancelled_and_discarded)
    assert scheduler.pending_ids("cover_letter") == (cancelled_in_db_only, kept)
    release.set()
    assert scheduler.wait_idle(WAIT)

    assert run_task.ids() == [first, kept]
    for task_id in (cancelled_in_db_only, cancelled_and_discarded):
        row = get_task(db, task_id)
        assert row is not None and (row.status, row.error) == (TaskStatus.FAILED, CANCELLED_ERROR)


def test_shutdown_leaves_unstarted_tasks_queued_for_next_start(
    make_scheduler: SchedulerFactory, db: Path
) -> None:
    holding = threading.Event()
    release = threading.Event()

    def hold(call: Call) -> None:
        holding.set()
        assert release.wait(WAIT)

    run_task = RecordingRunTask(hold)
    scheduler = make_scheduler(run_task, available_vram=UNLIMITED_VRAM_GB)
    ids = [queue_task(scheduler, "cover_letter") for _ in range(3)]
    scheduler.start()
    assert holding.wait(WAIT)

    scheduler.shutdown(timeout=0)  # stop now; the worker still holds its task
    release.set()
    assert scheduler.shutdown(timeout=WAIT)

    assert run_task.ids() == [ids[0]]
    assert scheduler_threads_alive() == []
    late, _ = insert_task(db, "cover_letter", 0, dedupe=False)
    assert not scheduler.enqueue(late, "cover_letter", 0)  # a stopped scheduler leaves it to the next one
    successor = make_scheduler(RecordingRunTask(), available_vram=UNLIMITED_VRAM_GB)
    # the stand-in never claims rows, so the held task is still queued too; the real run_task claims it
    assert successor.pending_ids("cover_letter") == (*ids, late)


def test_budget_larger_than_vram_runs_alone(
    make_scheduler: SchedulerFactory, run_task: RecordingRunTask, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=scheduler_module.__name__):
        scheduler = make_scheduler(run_task, budgets={"company_research": 80.0}, available_vram=24.0)
    assert "exceeds the available 24.0 GB" in caplog.text

    queue_task(scheduler, "company_research")
    scheduler.start()
    assert scheduler.wait_idle(WAIT)
    assert run_task.types() == ["company_research"]


def test_enqueue_refuses_non_llm_types(
    make_scheduler: SchedulerFactory, run_task: RecordingRunTask
) -> None:
    scheduler = make_scheduler(run_task, available_vram=UNLIMITED_VRAM_GB)
    with pytest.raises(ValueError, match=r"'discovery' is not an LLM task type.*submit_task"):
        scheduler.enqueue(1, "discovery", 0)


def test_get_scheduler_refuses_a_second_database(
    db: Path, tmp_path: Path, run_task: RecordingRunTask
) -> None:
    get_scheduler(db, run_task, available_vram=UNLIMITED_VRAM_GB)
    with pytest.raises(ValueError, match="reset_scheduler"):
        get_scheduler(tmp_path / "other.sqlite")


def test_submit_task_dedupes_and_runs_once(db: Path, run_task: RecordingRunTask) -> None:
    holding = threading.Event()
    release = threading.Event()

    def hold(call: Call) -> None:
        holding.set()
        assert release.wait(WAIT)

    run_task.hook = hold
    scheduler = get_scheduler(db, run_task, available_vram=UNLIMITED_VRAM_GB)
    first = submit_task(db, "cover_letter", job_id=42)
    assert holding.wait(WAIT)
    again = submit_task(db, "cover_letter", job_id=42)
    release.set()
    assert scheduler.wait_idle(WAIT)

    assert first[1] and again == (first[0], False)
    assert run_task.ids() == [first[0]]


class _FakeNvmlReader:
    def __init__(self, kind: str, totals: list[int]) -> None:
        self.kind = kind
        self._totals = totals
        self.closed = False

    def devices(self) -> list[types.SimpleNamespace]:
        return [
            types.SimpleNamespace(index=i, name=f"GPU {i}", total=t, used=0, free=t)
            for i, t in enumerate(self._totals)
        ]

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize(
    ("kind", "totals", "expected"),
    [("nvml", [24 * 10**9, 8 * 10**9], 32.0), ("host", [64 * 10**9], UNLIMITED_VRAM_GB)],
)
def test_available_vram_read_once_through_gpu_module(
    monkeypatch: pytest.MonkeyPatch, kind: str, totals: list[int], expected: float
) -> None:
    # NVML needs a GPU: this stands in for llmswap.machine behind its own interface
    reader = _FakeNvmlReader(kind, totals)
    fake_gpu = types.ModuleType("llmswap.machine")
    fake_gpu.open_reader = lambda: reader  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "llmswap.machine", fake_gpu)

    assert detect_available_vram() == expected
    assert reader.closed


def test_available_vram_without_gpu_module_is_unlimited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llmswap.machine", types.ModuleType("llmswap.machine"))
    assert detect_available_vram() == UNLIMITED_VRAM_GB
