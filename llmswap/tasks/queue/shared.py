"""The statements of a task queue that several llmswap hosts share on PostgreSQL: claims, leases, hosts.

A host claims the oldest queued task of a type it serves with `FOR UPDATE SKIP LOCKED` (two hosts never
take the same row, and neither waits for the other's claim), and holds it under a lease: its instance
id in `lease_owner`, a deadline in `lease_until`, renewed by the host's heartbeat while it runs. Every
time is the database's clock, so hosts whose clocks disagree still agree on who holds what.

A lease that runs out (its host died, or lost the database for longer than `tasks.leaseSeconds`) is
reaped by any host: the task goes back to the queue, the lost attempt counted like a preemption, and is
failed past `tasks.maxPreemptions` with an error naming the host. A result is written only under the
lease it was claimed with (`db.finish_task(owner=...)`), so the host that lost it cannot record one.

Hosts register in `llmswap_hosts` (name, instance, the task types and models they serve) and refresh
their row with each heartbeat; a row older than the lease is a host that is gone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmswap.tasks.queue.db import TASK_COLUMNS, TaskRow, connect, notify, now_text, task_row
from llmswap.tasks.queue.sql import TaskDb

_LEASE = "clock_timestamp() + make_interval(secs => ?)"


class HostNameTaken(RuntimeError):
    """Another live llmswap uses this `tasks.host`."""


@dataclass(frozen=True, slots=True)
class HostEntry:
    """One row of `llmswap_hosts`, with its heartbeat's age by the database's clock."""

    name: str
    instance: str
    types: tuple[str, ...]
    models: Mapping[str, str]  # every model id and alias it serves -> the model id
    age: float  # seconds since its last heartbeat

    def live(self, lease_seconds: float) -> bool:
        return self.age < lease_seconds


@dataclass(frozen=True, slots=True)
class Reaped:
    """A task whose lease ran out: back in the queue, or failed past the limit."""

    id: int
    task_type: str
    host: str | None
    requeued: bool


def claim(
    db: TaskDb, task_type: str, prefer: int, *, host: str, owner: str, lease_seconds: float
) -> TaskRow | None:
    """Claim task `prefer` if it is still queued and no other host is claiming it, else the oldest queued
    task of `task_type` that no other host is claiming; None when there is none."""
    with connect(db) as conn:
        record = conn.execute(
            f"UPDATE background_tasks SET status = 'running', started_at = ?, host = ?, lease_owner = ?,"
            f" lease_until = {_LEASE} WHERE status = 'queued' AND id = ("
            "  SELECT id FROM background_tasks WHERE status = 'queued' AND task_type = ?"
            "  ORDER BY (id = ?) DESC, created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED"
            f") RETURNING {TASK_COLUMNS}",
            (now_text(), host, owner, float(lease_seconds), task_type, prefer),
        ).fetchone()
    return None if record is None else task_row(record)


def any_queued(db: TaskDb, task_type: str) -> bool:
    with connect(db) as conn:
        record = conn.execute(
            "SELECT 1 FROM background_tasks WHERE status = 'queued' AND task_type = ? LIMIT 1", (task_type,)
        ).fetchone()
    return record is not None


def register(
    db: TaskDb, *, name: str, instance: str, types: list[str], models: Mapping[str, str], lease_seconds: float
) -> int:
    """Insert or refresh this host's row and renew the leases it holds; returns how many it renewed.

    Raises HostNameTaken when another instance holds the name and its heartbeat is younger than the lease.
    """
    with connect(db) as conn:
        record = conn.execute(
            "INSERT INTO llmswap_hosts (name, instance, types, models, started_at, heartbeat_at)"
            " VALUES (?, ?, ?, ?, clock_timestamp(), clock_timestamp())"
            " ON CONFLICT (name) DO UPDATE SET instance = EXCLUDED.instance, types = EXCLUDED.types,"
            "  models = EXCLUDED.models, heartbeat_at = EXCLUDED.heartbeat_at,"
            "  started_at = CASE WHEN llmswap_hosts.instance = EXCLUDED.instance"
            "   THEN llmswap_hosts.started_at ELSE EXCLUDED.started_at END"
            " WHERE llmswap_hosts.instance = EXCLUDED.instance"
            "  OR llmswap_hosts.heartbeat_at < clock_timestamp() - make_interval(secs => ?)"
            " RETURNING instance",
            (name, instance, json.dumps(sorted(types)), json.dumps(dict(models), sort_keys=True),
             float(lease_seconds)),
        ).fetchone()
        # The leases are this instance's whatever became of the name: they keep their tasks exclusive.
        renewed = conn.execute(
            f"UPDATE background_tasks SET lease_until = {_LEASE}"
            " WHERE status = 'running' AND lease_owner = ?",
            (float(lease_seconds), instance),
        ).rowcount
        if record is None:
            raise HostNameTaken(
                f"tasks.host {name!r} is used by another llmswap whose heartbeat is younger than "
                f"tasks.leaseSeconds ({lease_seconds:g} s): give each host its own tasks.host"
            )
    return int(renewed)


def leave(db: TaskDb, *, name: str, instance: str) -> None:
    """Remove this host's row (a clean stop): the others stop counting on its types at once."""
    with connect(db) as conn:
        conn.execute("DELETE FROM llmswap_hosts WHERE name = ? AND instance = ?", (name, instance))


def hosts(db: TaskDb) -> list[HostEntry]:
    with connect(db) as conn:
        records = conn.execute(
            "SELECT name, instance, types, models, EXTRACT(EPOCH FROM clock_timestamp() - heartbeat_at)"
            " FROM llmswap_hosts ORDER BY name"
        ).fetchall()
    return [HostEntry(name, instance, tuple(json.loads(types)), json.loads(models), float(age))
            for name, instance, types, models, age in records]


def reap(
    db: TaskDb, max_preemptions: int, *, predecessor_of: tuple[str, str] | None = None,
    held_by: str | None = None,
) -> list[Reaped]:
    """Send back to the queue every running task whose lease ran out, and also those that host
    `predecessor_of[0]` holds under another instance than `predecessor_of[1]` (an llmswap of that name
    that died before this one started), or those instance `held_by` holds (this host stopping). Each
    counts as an attempt; past `max_preemptions` the task fails, naming its host."""
    gone = "lease_until < clock_timestamp()"
    args: tuple[Any, ...] = ()
    if predecessor_of is not None:
        gone, args = f"({gone} OR (host = ? AND lease_owner <> ?))", predecessor_of
    elif held_by is not None:
        gone, args = f"({gone} OR lease_owner = ?)", (held_by,)
    over = "preemptions + 1 > ?"
    error = ("'its host ' || COALESCE(host, 'unknown') || ' stopped while running it (or lost the database"
             " for longer than tasks.leaseSeconds), ' || CAST(preemptions + 1 AS TEXT) || ' attempts (tasks."
             f"maxPreemptions: {int(max_preemptions)})'")
    with connect(db) as conn:
        records = conn.execute(
            f"UPDATE background_tasks SET preemptions = preemptions + 1,"
            f" status = CASE WHEN {over} THEN 'failed' ELSE 'queued' END,"
            f" error = CASE WHEN {over} THEN {error} ELSE NULL END, result = NULL,"
            f" started_at = CASE WHEN {over} THEN started_at ELSE NULL END,"
            f" finished_at = CASE WHEN {over} THEN ? ELSE NULL END, lease_owner = NULL, lease_until = NULL"
            f" WHERE status = 'running' AND lease_owner IS NOT NULL AND {gone}"
            " RETURNING id, task_type, host, status",
            (max_preemptions, max_preemptions, max_preemptions, max_preemptions, now_text(), *args),
        ).fetchall()
        reaped = [Reaped(int(i), t, h, s == "queued") for i, t, h, s in records]
        for task_type in sorted({r.task_type for r in reaped if r.requeued}):
            notify(conn, db, task_type)
    return reaped
