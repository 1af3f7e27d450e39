"""`llmswap tasks submit|list|show|cancel --config FILE`: the task queue from the command line.

`--config` (and `--config-dir`) may come before `tasks` or after the action, as with every command.

It works on the database the config names, so it needs no running server; a running server picks up
submitted rows within a second and skips cancelled ones.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from llmswap.cli.args import add_config_arguments, flag
from llmswap.config import ConfigError, ConfigSources
from llmswap.config.model import TasksConfig
from llmswap.tasks.queue.db import TaskStatus, cancel_task, get_task, init_db, insert_task, list_tasks
from llmswap.tasks.queue.sql import PostgresDb, TaskDb, task_db


def add_parser(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tasks = subcommands.add_parser("tasks", help="submit, list, show or cancel durable batch tasks")
    actions = tasks.add_subparsers(dest="tasks_command", required=True, metavar="{submit,list,show,cancel}")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        parser = actions.add_parser(name, help=help_text)
        add_config_arguments(parser, subcommand=True)
        return parser

    submit = command("submit", "queue a task")
    submit.add_argument("type", help="a task type from tasks.types")
    flag(
        submit, "params",
        required=True,
        metavar="JSON|@FILE",
        help="the OpenAI request body to send (JSON text, or @path to a JSON file)",
    )
    flag(
        submit, "job-id", dest="job_id",
        type=int,
        default=None,
        help="deduplicate: a queued or running task of this type and job is not queued again",
    )
    listing = command("list", "list tasks, newest first")
    flag(listing, "status", choices=[s.value for s in TaskStatus])
    flag(listing, "type")
    flag(listing, "limit", type=int, default=50)
    show = command("show", "show one task with its result")
    show.add_argument("id", type=int)
    cancel = command("cancel", "cancel a queued task (it is marked failed: cancelled)")
    cancel.add_argument("id", type=int)


def run(sources: ConfigSources, args: argparse.Namespace) -> int:
    try:
        config = sources.load()
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    if config.tasks is None:
        print(f"{sources}: no tasks: section; add one to use the task queue", file=sys.stderr)
        return 1
    tasks = config.tasks
    db = task_db(tasks.db)  # this command's own connections (a PostgreSQL pool), closed as it ends
    try:
        init_db(db)
        handler = {"submit": _submit, "list": _list, "show": _show, "cancel": _cancel}[args.tasks_command]
        return handler(tasks, db, args)
    finally:
        if isinstance(db, PostgresDb):
            db.close()


def _submit(tasks: TasksConfig, db: TaskDb, args: argparse.Namespace) -> int:
    if args.type not in tasks.types:
        known = ", ".join(sorted(tasks.types)) or "none"
        print(f"unknown task type {args.type!r}; configured types: {known}", file=sys.stderr)
        return 1
    try:
        params = _read_params(args.params)
    except (OSError, ValueError) as exc:
        print(f"--params: {exc}", file=sys.stderr)
        return 1
    task_id, is_new = insert_task(
        db, args.type, args.job_id or 0, params, dedupe=args.job_id is not None
    )
    _print({"id": task_id, "is_new": is_new})
    return 0


def _read_params(text: str) -> dict[str, Any]:
    raw = Path(text[1:]).read_text() if text.startswith("@") else text
    params = json.loads(raw)
    if not isinstance(params, dict):
        raise ValueError("must be a JSON object (the OpenAI request body)")
    return params


def _list(tasks: TasksConfig, db: TaskDb, args: argparse.Namespace) -> int:
    rows = list_tasks(db, status=args.status, task_type=args.type, limit=args.limit)
    for row in rows:
        error = f"  {row.error}" if row.error else ""
        head = f"{row.id:>6}  {row.status.value:<9}  {row.task_type:<20}  job {row.job_id:<6}"
        print(f"{head}  {row.created_at}{error}")
    return 0


def _show(tasks: TasksConfig, db: TaskDb, args: argparse.Namespace) -> int:
    row = get_task(db, args.id)
    if row is None:
        print(f"no task {args.id}", file=sys.stderr)
        return 1
    _print(row.as_json())
    return 0


def _cancel(tasks: TasksConfig, db: TaskDb, args: argparse.Namespace) -> int:
    if cancel_task(db, args.id):
        print(f"task {args.id} cancelled")
        return 0
    row = get_task(db, args.id)
    reason = (
        "does not exist" if row is None else f"is {row.status.value}; only a queued task can be cancelled"
    )
    print(f"task {args.id} {reason}", file=sys.stderr)
    return 1


def _print(value: Any) -> None:
    print(json.dumps(value, indent=2))
