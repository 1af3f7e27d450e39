"""The statements of the shared queue against a real PostgreSQL: claims, leases, hosts, schema, wake-ups."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from llmswap.tasks.batch_api import store
from llmswap.tasks.queue import db, shared
from llmswap.tasks.queue.claims import Claims
from llmswap.tasks.queue.db import NOTIFY_CHANNEL, TaskStatus
from llmswap.tasks.queue.schema import SCHEMA_VERSION, TaskDatabaseError
from llmswap.tasks.queue.sql import PostgresDb


def test_two_hosts_racing_for_500_tasks_never_claim_one_twice(pg_db: PostgresDb) -> None:
    db.init_db(pg_db)
    ids = db.insert_tasks(pg_db, [("letters", n, {"n": n}) for n in range(500)])
    claimed: dict[str, list[int]] = {"box1": [], "box2": []}
    recorded: list[bool] = []
    lock = threading.Lock()

    def worker(host: str, owner: str, stale: list[int]) -> None:
        claims = Claims(pg_db, host, owner=owner, lease_seconds=30)
        while True:
            # Each worker prefers a task from its own (stale) view of the queue, as a lane does.
            row = claims.claim("letters", stale.pop() if stale else 0)
            if row is None:
                return
            ok = claims.finish(row.id, TaskStatus.COMPLETED, result=json.dumps({"by": host}))
            with lock:
                claimed[host].append(row.id)
                recorded.append(ok)

    # Two hosts of three workers, every worker starting from the same list: they collide on purpose.
    threads = [threading.Thread(target=worker, args=(host, f"{host}-{n}", list(ids)))
               for host in claimed for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    everything = claimed["box1"] + claimed["box2"]
    assert sorted(everything) == ids  # each task claimed once: none twice, none left
    assert all(recorded) and len(recorded) == 500
    assert claimed["box1"] and claimed["box2"]
    rows = db.list_tasks(pg_db, limit=1000)
    assert Counter(r.status for r in rows) == {TaskStatus.COMPLETED: 500}
    assert all(json.loads(r.result or "{}")["by"] == r.host for r in rows)


def test_a_lapsed_lease_goes_back_to_the_queue_and_its_holder_cannot_record_a_result(
    pg_db: PostgresDb
) -> None:
    db.init_db(pg_db)
    task_id, _ = db.insert_task(pg_db, "letters", 1, {"n": 1})
    dead = Claims(pg_db, "box1", owner="box1-a", lease_seconds=3)
    alive = Claims(pg_db, "box2", owner="box2-a", lease_seconds=30)
    assert dead.claim("letters", task_id) is not None
    assert alive.claim("letters", task_id) is None  # held: nobody else takes it
    assert shared.reap(pg_db, 3) == []  # the lease has not run out yet

    time.sleep(3.1)
    reaped = shared.reap(pg_db, 3)
    assert reaped == [shared.Reaped(task_id, "letters", "box1", requeued=True)]
    again = alive.claim("letters", task_id)
    assert again is not None and again.preemptions == 1 and again.host == "box2"
    assert not dead.finish(task_id, TaskStatus.COMPLETED, result='"late"')  # its lease is gone
    assert alive.finish(task_id, TaskStatus.COMPLETED, result='"on time"')
    row = db.get_task(pg_db, task_id)
    assert row is not None
    assert (row.status, row.result, row.host) == (TaskStatus.COMPLETED, '"on time"', "box2")


def test_a_lease_renewed_by_the_heartbeat_does_not_lapse(pg_db: PostgresDb) -> None:
    db.init_db(pg_db)
    task_id, _ = db.insert_task(pg_db, "letters", 1)
    Claims(pg_db, "box1", owner="i1", lease_seconds=2).claim("letters", task_id)
    for _ in range(3):
        time.sleep(1.0)  # three renewals span 3 s, past the first lease's end
        assert shared.register(pg_db, name="box1", instance="i1", types=["letters"], models={},
                               lease_seconds=2) == 1
        assert shared.reap(pg_db, 3) == []


def test_past_max_preemptions_a_lapsed_task_fails_naming_the_host(pg_db: PostgresDb) -> None:
    db.init_db(pg_db)
    task_id, _ = db.insert_task(pg_db, "letters", 1)
    for attempt in range(2):
        assert Claims(pg_db, "box1", owner=f"i{attempt}", lease_seconds=1).claim("letters", task_id)
        time.sleep(1.05)
        outcome = shared.reap(pg_db, 1)
        assert [r.requeued for r in outcome] == [attempt == 0]
    row = db.get_task(pg_db, task_id)
    assert row is not None and row.status is TaskStatus.FAILED and row.preemptions == 2
    assert row.error is not None and "its host box1 stopped while running it" in row.error
    assert "tasks.maxPreemptions: 1" in row.error


def test_a_host_name_held_by_a_live_instance_is_refused_until_its_heartbeat_lapses(pg_db: PostgresDb) -> None:
    db.init_db(pg_db)
    shared.register(pg_db, name="box1", instance="first", types=["letters"], models={"a": "a"},
                    lease_seconds=3)
    with pytest.raises(shared.HostNameTaken, match=r"give each host its own tasks\.host"):
        shared.register(pg_db, name="box1", instance="second", types=[], models={}, lease_seconds=3)
    time.sleep(3.05)
    shared.register(pg_db, name="box1", instance="second", types=["research"], models={}, lease_seconds=3)
    [entry] = shared.hosts(pg_db)
    assert (entry.name, entry.instance, entry.types) == ("box1", "second", ("research",))
    shared.leave(pg_db, name="box1", instance="first")  # not the holder: nothing happens
    assert len(shared.hosts(pg_db)) == 1
    shared.leave(pg_db, name="box1", instance="second")
    assert shared.hosts(pg_db) == []


def test_a_predecessor_of_the_same_name_loses_its_tasks_to_the_queue_at_once(pg_db: PostgresDb) -> None:
    db.init_db(pg_db)
    mine, _ = db.insert_task(pg_db, "letters", 1)
    other, _ = db.insert_task(pg_db, "letters", 2)
    Claims(pg_db, "box1", owner="old", lease_seconds=30).claim("letters", mine)
    Claims(pg_db, "box2", owner="b", lease_seconds=30).claim("letters", other)
    reaped = shared.reap(pg_db, 3, predecessor_of=("box1", "new"))
    assert [r.id for r in reaped] == [mine]  # box2's task, under a live lease, stays where it is


def test_a_queued_task_notifies_the_listening_hosts(pg_db: PostgresDb) -> None:
    db.init_db(pg_db)
    with psycopg.connect(pg_db.url, autocommit=True) as listener:
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        db.insert_task(pg_db, "letters", 1)
        db.insert_tasks(pg_db, [("research", 1, None), ("research", 2, None)])
        payloads = [n.payload for n in listener.notifies(timeout=2, stop_after=2)]
    assert payloads == ["letters", "research"]


def test_submitting_the_same_job_from_two_hosts_at_once_makes_one_row(pg_db: PostgresDb) -> None:
    db.init_db(pg_db)
    results: list[tuple[int, bool]] = []
    barrier = threading.Barrier(8)

    def submit() -> None:
        barrier.wait()
        results.append(db.insert_task(pg_db, "letters", 42, {"n": 42}))

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len({task_id for task_id, _ in results}) == 1
    assert sorted(new for _, new in results) == [False] * 7 + [True]


def test_the_batch_api_tables_work_on_postgresql(pg_db: PostgresDb) -> None:
    db.init_db(pg_db)
    first = store.add_file(pg_db, "in.jsonl", "batch", b"one")
    second = store.add_file(pg_db, "out.jsonl", "batch_output", b"\x00two", owner="alice")
    assert [f.id for f in store.list_files(pg_db)] == [second.id, first.id]
    assert store.file_content(pg_db, second.id) == b"\x00two"
    assert store.get_file(pg_db, second.id, owner="bob") is None
    batch = store.add_batch(pg_db, endpoint="/v1/chat/completions", input_file_id=first.id,
                            completion_window="24h", expires_at=2_000_000_000, metadata={"k": "v"}, total=3,
                            status="in_progress")
    ids = db.insert_tasks(pg_db, [("batch:a", batch.seq, None)] * 3)
    for task_id, code in zip(ids[:2], (200, 500), strict=True):
        db.claim_task(pg_db, task_id, "box1")
        db.finish_task(pg_db, task_id, "completed", result=json.dumps({"status_code": code}))
    counts = store.request_counts(pg_db, batch.seq, 3)
    assert (counts.completed, counts.failed, counts.pending) == (1, 1, 1)
    assert store.batch_types_queued(pg_db) == {"batch:a"}
    assert store.set_batch_status(pg_db, batch.id, "cancelling", expect=("in_progress",))
    assert not store.set_batch_status(pg_db, batch.id, "cancelling", expect=("in_progress",))
    assert [b.id for b in store.list_batches(pg_db)] == [batch.id]


def test_a_schema_newer_than_the_code_is_refused(pg_db: PostgresDb, tmp_path: Path) -> None:
    db.init_db(pg_db)
    with psycopg.connect(pg_db.url, autocommit=True) as conn:
        conn.execute("UPDATE llmswap_schema SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(TaskDatabaseError, match=f"schema is version {SCHEMA_VERSION + 1}, newer than this"):
        db.init_db(pg_db)
    path = tmp_path / "tasks.sqlite"
    db.init_db(path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE llmswap_schema SET version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(TaskDatabaseError, match="Upgrade llmswap on this host"):
        db.init_db(path)


def test_a_sqlite_file_from_before_the_version_table_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as conn:  # the table as version 1 made it, with a queued row
        conn.execute("CREATE TABLE background_tasks (id INTEGER PRIMARY KEY AUTOINCREMENT, task_type TEXT NOT"
                     " NULL, job_id INTEGER NOT NULL DEFAULT 0, params TEXT, status TEXT NOT NULL DEFAULT"
                     " 'queued', error TEXT, result TEXT, created_at TEXT NOT NULL, started_at TEXT,"
                     " finished_at TEXT)")
        conn.execute("INSERT INTO background_tasks (task_type, created_at) VALUES ('letters', 'x')")
    db.init_db(path)
    db.init_db(path)
    row = db.claim_task(path, 1, "box1")
    assert row is not None and (row.host, row.preemptions) == ("box1", 0)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM llmswap_schema").fetchall() == [(SCHEMA_VERSION,)]



def test_a_preempted_attempt_goes_back_only_under_its_own_lease_and_wakes_the_hosts(
    pg_db: PostgresDb
) -> None:
    db.init_db(pg_db)
    task_id, _ = db.insert_task(pg_db, "letters", 1)
    holder = Claims(pg_db, "box1", owner="i1", lease_seconds=30)
    assert holder.claim("letters", task_id) is not None
    assert Claims(pg_db, "box2", owner="i2").requeue(task_id, 3) is None  # not its lease: left as it is
    with psycopg.connect(pg_db.url, autocommit=True) as listener:
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        outcome = holder.requeue(task_id, 3)
        assert [n.payload for n in listener.notifies(timeout=2, stop_after=1)] == ["letters"]
    assert outcome is not None and (outcome.requeued, outcome.preemptions) == (True, 1)
    again = Claims(pg_db, "box2", owner="i2").claim("letters", 0)
    assert again is not None and again.id == task_id and again.preemptions == 1


def test_a_cancel_wakes_the_hosts_so_they_drop_the_task(pg_db: PostgresDb) -> None:
    db.init_db(pg_db)
    task_id, _ = db.insert_task(pg_db, "letters", 1)
    with psycopg.connect(pg_db.url, autocommit=True) as listener:
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        assert db.cancel_task(pg_db, task_id)
        assert [n.payload for n in listener.notifies(timeout=2, stop_after=1)] == ["letters"]
    assert not db.cancel_task(pg_db, task_id)
    assert not shared.any_queued(pg_db, "letters")


def test_the_synchronous_library_refuses_a_shared_queue(pg_db: PostgresDb) -> None:
    from llmswap.tasks.peregrine.batching import TaskScheduler

    with pytest.raises(ValueError, match="runs on a SQLite file"):
        TaskScheduler(pg_db)


def test_a_closed_database_opens_its_pool_again_on_the_next_statement(pg_db: PostgresDb) -> None:
    db.init_db(pg_db)
    task_id, _ = db.insert_task(pg_db, "letters", 1)
    pool = pg_db.pool()
    pg_db.close()
    assert pool.closed
    row = db.get_task(pg_db, task_id)  # a new pool, this database's own
    assert row is not None and row.task_type == "letters" and pg_db.pool() is not pool
