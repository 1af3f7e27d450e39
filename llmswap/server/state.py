"""What every route reads: the live config, router and log rings, replaced as one on a config reload.

Handlers look these up per request (`state(request)`) and never keep them across awaits that span a
reload: after a reload, new requests see the new router while old ones finish on the old.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from llmswap.config.model import ApiKey, Config
from llmswap.process.logring import LogRing
from llmswap.router.router import Router
from llmswap.router.types import AcquireOptions


@dataclass
class ServerState:
    config: Config
    router: Router
    proxy_log: LogRing = field(default_factory=lambda: LogRing("proxy"))
    started_at: float = field(default_factory=time.time)
    # Whether the listener opens loopback addresses only: then a non-loopback Host is refused
    # (llmswap.server.http.guard). The lifecycle sets it from --listen.
    loopback_listener: bool = True
    # The port --listen opens (0: not known, a test's app): the default `tasks.host` is hostname:port.
    listen_port: int = 0
    # Called with every router put in place after the first (a config reload): see `install`.
    router_listeners: list[Callable[[Router], None]] = field(default_factory=list, repr=False)

    def install(self, router: Router, config: Config) -> None:
        """Put a reload's router and config in place and tell every `watch_router` listener, synchronously:
        each sees the new router before it can handle any request."""
        self.router = router
        self.config = config
        for listener in tuple(self.router_listeners):
            listener(router)

    def watch_router(self, listener: Callable[[Router], None]) -> None:
        """Call `listener(router)` now with the current router and again with each one a reload installs
        (e.g. to add a router observer: observers belong to one router, and a reload brings a new one)."""
        self.router_listeners.append(listener)
        listener(self.router)

    @property
    def upstream_log(self) -> LogRing:
        return self.router.upstream_log

    def model_log(self, model: str) -> LogRing | None:
        process = self.router.processes.get(model)
        logs = getattr(process, "logs", None)
        return logs if isinstance(logs, LogRing) else None


STATE: web.AppKey[ServerState] = web.AppKey("llmswap_state", ServerState)
# Set by the auth middleware on every authenticated request: the matching key (absent when auth is off).
API_KEY: web.RequestKey[ApiKey] = web.RequestKey("llmswap_api_key", ApiKey)


def state(request: web.Request) -> ServerState:
    return request.app[STATE]


def request_api_key(request: web.Request) -> ApiKey | None:
    key = request.get(API_KEY)
    return key if isinstance(key, ApiKey) else None


def request_options(request: web.Request, priority: int | None = None, **more: Any) -> AcquireOptions:
    """How a client's request asks the router for its model: at `priority` (None: its API key's default,
    else 0), as its API key (per-key limits), with `more` of `AcquireOptions` (callbacks, a deadline)."""
    key = request_api_key(request)
    if priority is None:
        priority = key.priority if key is not None else 0
    return AcquireOptions(priority=priority, api_key=key.key if key is not None else None, **more)


class RingHandler(logging.Handler):
    """Copies the proxy's own log records into the `proxy` ring that /logs serves."""

    def __init__(self, ring: LogRing) -> None:
        super().__init__()
        self.ring = ring

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.ring.append(self.format(record))
        except Exception:
            self.handleError(record)
