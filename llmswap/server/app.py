"""The aiohttp application: middlewares in order, then each route family registered by its own module."""

from __future__ import annotations

import asyncio

from aiohttp import web

from llmswap.server.state import STATE, ServerState
from llmswap.tasks import http as task_http
from llmswap.tasks.http import TASKS
from llmswap.tasks.service import TaskService


def create_app(server_state: ServerState) -> web.Application:
    from llmswap.server import admin, auth, events, inference, logs, metrics, middleware, ui, upstream

    app = web.Application(
        client_max_size=server_state.config.max_request_body,
        middlewares=[middleware.access_log, middleware.errors, middleware.cors, auth.middleware],
        handler_args={"tcp_keepalive": True},
    )
    app[STATE] = server_state
    middleware.setup(app)
    inference.setup(app)
    admin.setup(app)
    logs.setup(app)
    upstream.setup(app)
    task_http.setup(app)
    metrics.setup(app)
    events.setup(app)
    ui.setup(app)
    if server_state.config.tasks is not None:
        app.on_startup.append(_start_tasks)
        app.on_cleanup.append(_stop_tasks)
    return app


async def _start_tasks(app: web.Application) -> None:
    # Tasks read the router through the state on every run: a config reload swaps it.
    service = TaskService(app[STATE].config, lambda: app[STATE].router, asyncio.get_running_loop())
    service.start()
    app[TASKS] = service


async def _stop_tasks(app: web.Application) -> None:
    service = app.get(TASKS)
    if service is not None:
        await service.shutdown()
