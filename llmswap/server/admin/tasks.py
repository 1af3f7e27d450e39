"""The task queue's HTTP API under /api/tasks (auth applies as on every other route).

POST /api/tasks {"type", "job_id"?, "params"} · GET /api/tasks?status=&type=&limit= · GET /api/tasks/stats ·
GET /api/tasks/{id} · DELETE /api/tasks/{id} (cancel a queued task).

Every database call runs on a worker thread (`asyncio.to_thread`): SQLite may wait on its lock for up to
its busy timeout, and the event loop serves every other request meanwhile.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from llmswap.server.http.errors import error_response
from llmswap.tasks.queue.db import TaskStatus, get_task, list_tasks
from llmswap.tasks.queue.service import TaskService, UnknownTaskType

MAX_LIST = 1000
MAX_TASK_ID = 2**63 - 1  # SQLite's largest integer


def setup(app: web.Application) -> None:
    app.router.add_post("/api/tasks", submit)
    app.router.add_get("/api/tasks", listing)
    app.router.add_get("/api/tasks/stats", stats)
    app.router.add_get(r"/api/tasks/{task_id:\d+}", show)
    app.router.add_delete(r"/api/tasks/{task_id:\d+}", cancel)


class Tasks:
    """Where the server's task service is, once the config has a `tasks:` section (the app makes it at
    start-up, or when a reload adds the section)."""

    def __init__(self) -> None:
        self.service: TaskService | None = None

    def enabled(self) -> TaskService | None:
        """The task service; None when the config has no `tasks:` (or a reload removed it)."""
        service = self.service
        return service if service is not None and service.enabled else None


TASKS: web.AppKey[Tasks] = web.AppKey("llmswap_tasks", Tasks)


async def _service(request: web.Request) -> TaskService | None:
    """The task service, once its database is ready (`TaskService.settled`); None without `tasks:`."""
    service = request.app[TASKS].enabled()
    if service is not None:
        await service.settled()
    return service


def _not_configured(request: web.Request) -> web.Response:
    return error_response(
        request, 404, "the task queue is not configured: add a `tasks:` section to the config"
    )


async def submit(request: web.Request) -> web.Response:
    service = await _service(request)
    if service is None:
        return _not_configured(request)
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deeply
        return error_response(
            request, 400, 'body must be JSON: {"type": ..., "job_id"?: int, "params": {...}}'
        )
    if not isinstance(body, dict) or not isinstance(body.get("type"), str):
        return error_response(request, 400, 'body must be an object with a string "type"', code="bad_request")
    job_id = body.get("job_id")
    if job_id is not None and (not isinstance(job_id, int) or isinstance(job_id, bool)):
        return error_response(request, 400, f'"job_id" must be an integer, got {job_id!r}')
    params = body.get("params")
    if not isinstance(params, dict):
        return error_response(request, 400, '"params" must be an object: the OpenAI request body to send')
    try:
        task_id, is_new = await service.submit(body["type"], job_id, params)
    except UnknownTaskType as exc:
        return error_response(request, 400, str(exc))
    row = await asyncio.to_thread(get_task, service.db, task_id)
    status = row.status.value if row is not None else TaskStatus.QUEUED.value
    return web.json_response(
        {"id": task_id, "is_new": is_new, "status": status}, status=201 if is_new else 200
    )


async def show(request: web.Request) -> web.Response:
    service = await _service(request)
    if service is None:
        return _not_configured(request)
    task_id = int(request.match_info["task_id"])
    row = await asyncio.to_thread(get_task, service.db, task_id) if task_id <= MAX_TASK_ID else None
    if row is None:
        return error_response(request, 404, f"no task {request.match_info['task_id']}")
    return web.json_response(row.as_json())


async def listing(request: web.Request) -> web.Response:
    service = await _service(request)
    if service is None:
        return _not_configured(request)
    status = request.query.get("status") or None
    if status is not None and status not in {s.value for s in TaskStatus}:
        valid = ", ".join(s.value for s in TaskStatus)
        return error_response(request, 400, f"status must be one of {valid}, got {status!r}")
    try:
        limit = int(request.query.get("limit", "100"))
    except ValueError:
        return error_response(request, 400, f"limit must be an integer, got {request.query['limit']!r}")
    if not 1 <= limit <= MAX_LIST:
        return error_response(request, 400, f"limit must be between 1 and {MAX_LIST}, got {limit}")
    task_type = request.query.get("type") or None
    rows = await asyncio.to_thread(list_tasks, service.db, status=status, task_type=task_type, limit=limit)
    return web.json_response({"tasks": [row.as_json() for row in rows]})


async def cancel(request: web.Request) -> web.Response:
    service = await _service(request)
    if service is None:
        return _not_configured(request)
    task_id = int(request.match_info["task_id"])
    if task_id > MAX_TASK_ID:  # beyond SQLite's integers: no such task (sqlite3 would raise OverflowError)
        return error_response(request, 404, f"no task {task_id}")
    if await service.cancel(task_id):
        row = await asyncio.to_thread(get_task, service.db, task_id)
        return web.json_response(row.as_json() if row is not None else {"id": task_id})
    row = await asyncio.to_thread(get_task, service.db, task_id)
    if row is None:
        return error_response(request, 404, f"no task {task_id}")
    return error_response(
        request, 409, f"task {task_id} is {row.status.value}: only a queued task can be cancelled"
    )


async def stats(request: web.Request) -> web.Response:
    service = await _service(request)
    if service is None:
        return _not_configured(request)
    body: dict[str, Any] = await service.stats()
    return web.Response(text=json.dumps(body), content_type="application/json")
