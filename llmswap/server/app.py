"""The composition root: `create_app` builds the server's parts (`llmswap.server.services`), then the
aiohttp application with its one middleware and each route group, handed the parts it uses, and subscribes
the parts that follow the router (and its config) to every router a reload installs (`_follow_routers`)."""

from __future__ import annotations

import asyncio
import logging
import socket

from aiohttp import web

from llmswap.router.router import Router
from llmswap.server.admin import batches as batch_http
from llmswap.server.admin import kvcache as kvcache_http
from llmswap.server.admin import models as admin
from llmswap.server.admin import tasks as tasks_http
from llmswap.server.http import guard, middleware
from llmswap.server.inference import inflight, peer_watch, profiles, realtime
from llmswap.server.inference import passthrough as upstream
from llmswap.server.inference import routes as inference
from llmswap.server.observe import activity as activity_api
from llmswap.server.observe import events, logs, metrics, ui
from llmswap.server.observe import performance as performance_api
from llmswap.server.observe.request_metrics import count_tokens
from llmswap.server.services import SERVICES, Services, build_services
from llmswap.server.state import STATE, ServerState
from llmswap.tasks.queue.service import TaskService

log = logging.getLogger("llmswap.tasks")


def create_app(server_state: ServerState, services: Services | None = None) -> web.Application:
    """The application serving `server_state`, over `services` (default: `build_services`)."""
    parts = services if services is not None else build_services(server_state)
    app = web.Application(
        client_max_size=server_state.config.max_request_body,
        middlewares=[middleware.gate],
        handler_args={"tcp_keepalive": True},
    )
    app[STATE] = server_state
    app[SERVICES] = parts
    parts.install(app)
    middleware.setup(app)
    guard.setup(app)
    inference.setup(app)
    admin.setup(app)
    kvcache_http.setup(app)
    logs.setup(app)
    upstream.setup(app)
    realtime.setup(app)
    tasks_http.setup(app)
    batch_http.setup(app)
    metrics.setup(app)
    events.setup(app)
    profiles.setup(app)
    activity_api.setup(app)
    _follow_routers(server_state, parts)
    count_tokens(parts.metrics.registry, parts.recorder)
    inflight.setup(app)
    peer_watch.setup(app)
    performance_api.setup(app)
    ui.setup(app)
    app.on_startup.append(_follow_on_the_loop)
    # At shutdown, not cleanup: the task in hand finishes (or goes back to the queue) while the upstream
    # connections, which cleanup closes, are still there.
    app.on_shutdown.append(_stop_tasks)
    return app


def _follow_routers(server_state: ServerState, parts: Services) -> None:
    """Every part that follows the router, told now and again, synchronously, by each reload that installs a
    new one (`ServerState.watch_router`): observers belong to one router, settings to one config."""
    server_state.watch_router(parts.metrics.watch)  # swaps, process events, queue gauges
    server_state.watch_router(parts.events.watch)  # /api/events
    server_state.watch_router(parts.profiles.follow)  # the startup profile of a new config
    recorder = parts.recorder
    server_state.watch_router(lambda router: recorder.configure(activity_api.settings_of(router.config)))
    server_state.watch_router(parts.performance.follow)  # the models' processes to sample
    # The answers' prompt rates, learned while the config has a kvCache model (`kvCache.save: auto`).
    learn = kvcache_http.PromptRates(lambda: server_state.router)
    server_state.watch_router(lambda router: learn.follow(router.config, recorder.listeners))


async def _follow_on_the_loop(app: web.Application) -> None:
    """At startup, once there is a running loop: the discover peers' followers and the task queue, which
    start tasks of their own, follow each config from then on."""
    server_state = app[STATE]
    parts = app[SERVICES]
    server_state.watch_router(lambda router: parts.peers.reconcile(router.config))
    _follow_tasks(server_state, parts, asyncio.get_running_loop())


def _follow_tasks(server_state: ServerState, parts: Services, loop: asyncio.AbstractEventLoop) -> None:
    """Run the task queue when the config has a `tasks:` section, and follow every reload's config: the
    service starts when a reload adds the section and is reconfigured in place after that."""

    def follow(router: Router) -> None:
        # Called inside the reload, with the new router (and its config) already in place.
        try:
            service = parts.tasks.service
            if service is not None:
                service.reconfigure(router.config)
            elif router.config.tasks is not None:
                # Tasks read the router through the state on every run: a config reload swaps it.
                service = TaskService(router.config, lambda: server_state.router, parts.dispatcher, loop,
                                      host=f"{socket.gethostname()}:{server_state.listen_port}")
                service.start()
                parts.tasks.service = service
        except Exception:
            log.exception("tasks: following the config failed; the task queue keeps its previous settings")

    server_state.watch_router(follow)


async def _stop_tasks(app: web.Application) -> None:
    service = app[SERVICES].tasks.service
    if service is not None:
        await service.shutdown()
