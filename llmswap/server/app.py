"""The aiohttp application: its one middleware, then each route family registered by its own module."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from llmswap.router.base import BaseRouter
from llmswap.server import batch_http
from llmswap.server import tasks_http as task_http
from llmswap.server.activity_api import recorder_of
from llmswap.server.proxy import dispatcher
from llmswap.server.state import STATE, ServerState
from llmswap.server.tasks_http import TASKS_KEY, task_service
from llmswap.tasks.service import TaskService

log = logging.getLogger("llmswap.tasks")


def create_app(server_state: ServerState) -> web.Application:
    from llmswap.server import (
        activity_api,
        activity_metrics,
        admin,
        cancel,
        events,
        guard,
        inference,
        logs,
        metrics,
        middleware,
        performance_api,
        profiles,
        realtime,
        ui,
        upstream,
    )

    app = web.Application(
        client_max_size=server_state.config.max_request_body,
        middlewares=[middleware.gate],
        handler_args={"tcp_keepalive": True},
    )
    app[STATE] = server_state
    middleware.setup(app)
    guard.setup(app)
    inference.setup(app)
    admin.setup(app)
    logs.setup(app)
    upstream.setup(app)
    realtime.setup(app)
    task_http.setup(app)
    batch_http.setup(app)
    metrics.setup(app)
    events.setup(app)
    profiles.setup(app)
    activity_api.setup(app)
    activity_api.publish_to(server_state)
    dispatcher(server_state).recorder = recorder_of(server_state)  # tasks and batch requests are recorded
    activity_metrics.setup(server_state)
    cancel.setup(app)
    performance_api.setup(app)
    ui.setup(app)
    app.on_startup.append(_start_tasks)
    app.on_cleanup.append(_stop_tasks)
    return app


async def _start_tasks(app: web.Application) -> None:
    """Run the task queue when the config has a `tasks:` section, and follow every reload's config: the
    service starts when a reload adds the section and is reconfigured in place after that."""
    server_state = app[STATE]
    loop = asyncio.get_running_loop()

    def follow(router: BaseRouter) -> None:
        # Called inside the reload, with the new router (and its config) already in place.
        try:
            service = task_service(server_state, enabled_only=False)
            if service is not None:
                service.reconfigure(router.config)
            elif router.config.tasks is not None:
                # Tasks read the router through the state on every run: a config reload swaps it.
                live = dispatcher(server_state)
                service = TaskService(router.config, lambda: server_state.router, live, loop)
                service.start()
                server_state.extras[TASKS_KEY] = service
        except Exception:
            log.exception("tasks: following the config failed; the task queue keeps its previous settings")

    server_state.watch_router(follow)


async def _stop_tasks(app: web.Application) -> None:
    service = task_service(app[STATE], enabled_only=False)
    if service is not None:
        await service.shutdown()
