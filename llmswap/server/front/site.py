"""The front's listener (`FrontSite`, in place of aiohttp's `TCPSite`) and what its connections share
(`Front`): the route table, the live header timeout, the registry the graceful stop walks, and the
hand-over of a connection to aiohttp.

A hand-over makes the aiohttp request handler the runner's server would have made for a new connection
(`Runner.server()`: a `ClientConnection`), puts it on the transport in place of the front's protocol,
tells it the connection was made (it registers with the server, so the stop and the connection count
cover it from then on) and feeds it the raw bytes the front held back. aiohttp then parses them as if it
had read them itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from aiohttp import web

from llmswap.server.connections import Runner
from llmswap.server.front.protocol import FrontConnection
from llmswap.server.front.request import FastPlan, FrontRequest, route_table
from llmswap.server.front.serve import serve_fast
from llmswap.server.inference import ROUTES, InferenceRoute

log = logging.getLogger("llmswap.server")


class Front:
    """What every front connection of one runner shares."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.app = runner.app
        self.routes: Mapping[str, InferenceRoute] = route_table(ROUTES)
        # Who serves each new connection: None, this process; else a callable that answers the protocol
        # of one that goes elsewhere (a worker process), or None for one this process keeps.
        self.share: Callable[[], asyncio.Protocol | None] | None = None

    def connection(self) -> asyncio.Protocol:
        """The protocol of a connection just accepted."""
        if self.share is not None:
            try:
                elsewhere = self.share()
            except Exception:  # asyncio would reset the connection and say nothing (outside its debug mode)
                log.exception("choosing who serves a new connection failed; this process serves it")
                elsewhere = None
            if elsewhere is not None:
                return elsewhere
        return FrontConnection(self)

    def header_timeout(self) -> float:
        return self.runner.header_timeout()

    def held(self, connection: FrontConnection) -> None:
        self.runner.connection_server().front_held.add(connection)

    def released(self, connection: FrontConnection) -> None:
        self.runner.connection_server().front_held.discard(connection)

    async def serve(self, connection: FrontConnection, request: FrontRequest, plan: FastPlan) -> None:
        await serve_fast(connection, request, plan)

    def hand_over(self, transport: asyncio.Transport, rest: bytes, *, write_paused: bool) -> None:
        """From now on aiohttp serves this connection, starting with the bytes in `rest`."""
        handler = self.runner.connection_server()()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if write_paused:
            handler.pause_writing()
        if rest:
            handler.data_received(rest)


class FrontSite(web.TCPSite):
    """A TCP (or TLS) listener whose connections start on the front (`front`, once started)."""

    front: Front | None = None

    async def start(self) -> None:
        runner = self._runner
        if not isinstance(runner, Runner):
            raise TypeError("FrontSite serves through llmswap's Runner")
        await web.BaseSite.start(self)  # registers the site with the runner
        front = self.front = Front(runner)
        server = await asyncio.get_running_loop().create_server(
            front.connection,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        self._server = server
        self._bound_port = server.sockets[0].getsockname()[1] if server.sockets else self._port
