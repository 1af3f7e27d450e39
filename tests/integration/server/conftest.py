"""Serve the real llmswap app on a real loopback port for the server tests.

`serve_config` is a factory fixture: `served = await serve_config(config)` builds the router and the
`ServerState` for `config`, starts the router, serves `create_app(state)` on 127.0.0.1 through an aiohttp
`AppRunner`, and returns a `Served` (base URL, state, app). Everything it served is torn down when the test
ends — the HTTP site first (open handlers get a short grace), then every router the state ever held, so no
demo upstream outlives its test. `http` is a plain client session for talking to it; `openai_for(served)`
an `openai` SDK client of it, closed after the test; `until(predicate)` waits for an in-process or async
condition (router state, an upstream's /props) with a generous bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from llmswap.config.model import Config
from llmswap.router import ProcessFactory, Router, build_router
from llmswap.server.app import create_app
from llmswap.server.http.connections import Runner
from llmswap.server.services import SERVICES, Services
from llmswap.server.state import ServerState
from tests.helpers.slow_callbacks import SLOW, SlowCallbacks

HOST = "127.0.0.1"
# Handlers still streaming when a test ends get this long before their connections are dropped.
SHUTDOWN_GRACE = 1.0
ROUTER_SHUTDOWN_GRACE = 2.0


@dataclass
class Served:
    """One running llmswap server: where it listens and what it serves from."""

    url: str  # base URL, no trailing slash
    state: ServerState
    app: web.Application
    runner: web.AppRunner

    @property
    def router(self) -> Router:
        # Read through the state: a config reload swaps the router under the same server.
        return self.state.router

    @property
    def config(self) -> Config:
        return self.state.config

    @property
    def services(self) -> Services:
        return self.app[SERVICES]

    def at(self, path: str) -> str:
        return f"{self.url}{path}"


class ServeConfig(Protocol):
    def __call__(
        self,
        config: Config,
        *,
        router: Router | None = None,
        process_factory: ProcessFactory | None = None,
        services: Callable[[ServerState], Services] | None = None,
        **state_fields: Any,
    ) -> Awaitable[Served]: ...


@contextlib.asynccontextmanager
async def serving(
    config: Config,
    *,
    router: Router | None = None,
    process_factory: ProcessFactory | None = None,
    services: Callable[[ServerState], Services] | None = None,
    **state_fields: Any,
) -> AsyncIterator[Served]:
    """Serve `config` for the duration of the block (the fixture uses this; tests needing two servers at
    different moments can use it directly). `router` replaces the one `build_router` would make;
    `services(state)` builds the server's parts in place of `build_services` (a fake GPU, feed options)."""
    the_router = router if router is not None else build_router(config, process_factory=process_factory)
    server_state = ServerState(config=config, router=the_router, **state_fields)
    routers: list[Router] = [the_router]
    runner: web.AppRunner | None = None
    try:
        the_router.start()
        app = create_app(server_state, services(server_state) if services is not None else None)
        runner = Runner(app, header_timeout=lambda: server_state.config.client_header_timeout,
                        shutdown_timeout=SHUTDOWN_GRACE)
        await runner.setup()
        site = web.TCPSite(runner, HOST, 0)
        await site.start()
        port = _bound_port(runner)
        tasks = app[SERVICES].tasks.service
        if tasks is not None:
            await tasks.settled()  # tests write rows straight into the database: its tables first
        yield Served(url=f"http://{HOST}:{port}", state=server_state, app=app, runner=runner)
    finally:
        if server_state.router not in routers:
            routers.append(server_state.router)
        if runner is not None:
            await runner.cleanup()
        for each in routers:
            if not each.closing:
                await each.shutdown(ROUTER_SHUTDOWN_GRACE)


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    raise AssertionError(f"the test server is not listening on a TCP port: {runner.addresses}")


@pytest.fixture(autouse=True)
async def no_blocking_on_the_loop(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Every server test runs in asyncio's debug mode and fails when one callback held the loop longer than
    100 ms (a database call, a folder scan, a sleep on the loop), but one marked `slow_callbacks(reason)`.
    LLMSWAP_LOOP_DEBUG=0 turns it off."""
    if os.environ.get("LLMSWAP_LOOP_DEBUG", "1") == "0" or request.node.get_closest_marker("slow_callbacks"):
        yield
        return
    watch = SlowCallbacks()
    watch.watch(asyncio.get_running_loop())
    try:
        yield
    finally:
        watch.close()
    assert not watch.caught, f"callbacks held the event loop longer than {SLOW * 1000:.0f} ms:\n" + \
        "\n".join(watch.caught)


@pytest.fixture
async def serve_config() -> AsyncIterator[ServeConfig]:
    """A factory: `await serve_config(config, **options)` → `Served`; all of them stop after the test."""
    async with contextlib.AsyncExitStack() as stack:

        async def serve(
            config: Config,
            *,
            router: Router | None = None,
            process_factory: ProcessFactory | None = None,
            services: Callable[[ServerState], Services] | None = None,
            **state_fields: Any,
        ) -> Served:
            return await stack.enter_async_context(
                serving(config, router=router, process_factory=process_factory, services=services,
                        **state_fields)
            )

        yield serve


OpenAiFor = Callable[..., AsyncOpenAI]


@pytest.fixture
async def openai_for() -> AsyncIterator[OpenAiFor]:
    """A factory: `openai_for(served, key="unused")` → the `openai` SDK's client of that server, closed
    when the test ends. An SDK client left open closes its connections from its finaliser, as a task on
    whichever event loop runs when it is collected: a later test's, whose loop then logs a traceback (seen
    failing the fuzz test, which reads its llmswap's log for tracebacks)."""
    made: list[AsyncOpenAI] = []

    def make(served: Served, key: str = "unused") -> AsyncOpenAI:
        made.append(AsyncOpenAI(base_url=served.at("/v1"), api_key=key, max_retries=0, timeout=30))
        return made[-1]

    yield make
    for client in made:
        await client.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session with a generous overall bound, so a hung server fails the test instead of the run."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session
