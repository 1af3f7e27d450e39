"""Client connections, below the routes: how many llmswap can hold, how long a silent one may stay, what a
request aiohttp cannot parse is answered, and `Connection: close` once a stop began.

    descriptors   `raise_open_file_limit` lifts the soft RLIMIT_NOFILE to the hard limit at start (each
                  request in flight holds two descriptors: the client's and the upstream's); running out
                  anyway in the accept loop is one rate-limited warning (`DescriptorWarnings`), not a
                  traceback per attempt
    header time   a connection must deliver a complete request head within `clientHeaderTimeout` seconds
                  of opening, or of the end of its previous response; otherwise it is closed (idle and
                  slowloris sockets alike)
    parser errors too many headers, a header or request line too long, broken framing: 431/400 in OpenAI's
                  error envelope, logged as one line; an Expect other than 100-continue: 417, likewise
    stopping      once `Runner.begin_stop()` was called every response says `Connection: close`, and the
                  connection closes after it, so no client sends a next request into a closing connection

`Runner` is the `aiohttp.web.AppRunner` that wires this in; the server and the tests both serve through it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import resource
from collections.abc import Callable
from typing import Any

from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from llmswap.server.http.errors import error_body

log = logging.getLogger("llmswap.server")

DESCRIPTOR_WARNING_INTERVAL = 30.0  # seconds between two warnings about running out of descriptors
_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})


# -------------------------------------------------------------------------------- descriptors


def raise_open_file_limit() -> tuple[int, int]:
    """Lift the soft RLIMIT_NOFILE to the hard limit, logging what changed; (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    if soft == unlimited or (hard != unlimited and soft >= hard):
        log.debug("open-file limit: %s (already the hard limit)", "unlimited" if soft == unlimited else soft)
        return soft, soft
    # An unlimited hard limit may still refuse huge soft limits (macOS caps them): try smaller ones then.
    for wanted in ([hard] if hard != unlimited else [1 << 20, 65536, 10240]):
        if wanted <= soft:
            continue
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):
            continue
        log.info("open-file limit raised from %d to %d (the hard limit is %s)", soft, wanted,
                 "unlimited" if hard == unlimited else hard)
        return soft, wanted
    log.warning("open-file limit: %d, and it could not be raised (hard limit %s); each request in flight "
                "holds two descriptors", soft, hard)
    return soft, soft


class DescriptorWarnings:
    """An event-loop exception handler: the accept loop running out of descriptors (EMFILE, ENFILE) is one
    warning per `interval` seconds; everything else goes to the loop's default handler."""

    def __init__(self, interval: float = DESCRIPTOR_WARNING_INTERVAL) -> None:
        self.interval = interval
        self._last = -math.inf
        self._since_last = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if not (isinstance(exc, OSError) and exc.errno in _OUT_OF_DESCRIPTORS):
            loop.default_exception_handler(context)
            return
        self._since_last += 1
        now = loop.time()
        if now - self._last < self.interval:
            return
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        log.warning(
            "out of file descriptors (%s; %d times since the last warning): new connections wait until "
            "others close. The open-file limit is %d: raise it (ulimit -n), or lower clientHeaderTimeout so "
            "idle clients are closed sooner", exc.strerror or exc, self._since_last, soft,
        )
        self._last = now
        self._since_last = 0


# -------------------------------------------------------------------------------- one connection


def parser_error_answer(exc: HttpProcessingError) -> tuple[int, str]:
    """(status, message) for a request aiohttp's parser refused."""
    why = " ".join(str(exc.message).split()) or type(exc).__name__
    if isinstance(exc, LineTooLong) or "too many headers" in why.lower():
        return 431, f"request header fields too large: {why}"
    status = exc.code if 400 <= exc.code < 500 else 400
    return status, f"malformed HTTP request: {why}"


class ClientConnection(RequestHandler):
    """aiohttp's request handler with a deadline for the first request head and JSON parser errors.

    Later heads are bounded by aiohttp's keep-alive timer, given the same timeout: it closes a connection
    still waiting for a complete head that long after its previous response.
    """

    def __init__(self, manager: web.Server, *, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(manager, keepalive_timeout=header_timeout, **kwargs)
        self._header_timeout = header_timeout
        self._head_deadline: asyncio.TimerHandle | None = None
        self.hangup_task: asyncio.Task[Any] | None = None  # see `cancel_on_hangup`

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._head_deadline = self._loop.call_later(self._header_timeout, self._first_head_overdue)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None
        super().connection_lost(exc)
        task, self.hangup_task = self.hangup_task, None
        if task is not None and not task.done():
            task.cancel()

    def _first_head_overdue(self) -> None:
        self._head_deadline = None
        if self._request_count == 0:  # aiohttp's count of request heads parsed on this connection
            log.debug("closing a connection from %s: no complete request within %gs (clientHeaderTimeout)",
                      self.peername, self._header_timeout)
            self.force_close()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        status, text = parser_error_answer(exc)
        log.info("refused a malformed request from %s: %s", request.remote, text)
        response = _json_error(status, text)
        response.force_close()  # the byte stream is not at a request boundary any more
        return response

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        # After a response aiohttp reads what is left of an unread request body; a client's broken
        # remainder (bad chunking, a false Content-Encoding) is the client's fault, not a traceback.
        exc = kwargs.get("exc_info")
        if isinstance(exc, (RequestPayloadError, HttpProcessingError)):
            log.debug("dropped the unreadable rest of a request body from %s: %s", self.peername, exc)
            return
        super().log_exception(*args, **kwargs)


def cancel_on_hangup(request: web.BaseRequest, task: asyncio.Task[Any] | None = None) -> None:
    """Have `task` (default: the running one, the request's handler) cancelled when the client's connection
    is lost before it ends: seen by the transport, with no watcher task. Only the routes that ask
    (inference): aiohttp's `handler_cancellation` would cancel every handler, websocket relays finishing a
    close among them."""
    protocol = request.protocol
    if isinstance(protocol, ClientConnection):
        protocol.hangup_task = task or asyncio.current_task()


def keep_on_hangup(request: web.BaseRequest) -> None:
    """Undo `cancel_on_hangup`: from now on the handler sees a hang-up itself (a websocket relay that must
    still pass on the client's close)."""
    protocol = request.protocol
    if isinstance(protocol, ClientConnection):
        protocol.hangup_task = None


def _json_error(status: int, message: str) -> web.Response:
    return web.Response(status=status, body=error_body(status, message), content_type="application/json")


class ConnectionServer(web.Server):
    """aiohttp's server, making a `ClientConnection` (with the live config's header timeout) per client."""

    def __init__(self, made: web.Server, header_timeout: Callable[[], float], **handler_args: Any) -> None:
        super().__init__(self._handle, request_factory=made.request_factory,
                         handler_cancellation=made.handler_cancellation)
        self._app_handler = made.request_handler
        self._header_timeout = header_timeout
        self._handler_args = handler_args

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        # aiohttp answers an Expect header before any middleware runs, in plain text (and with a 500 when
        # the value is not UTF-8); only 100-continue means something, so anything else is refused here.
        expect = request.headers.get(hdrs.EXPECT)
        if expect is not None and expect.strip().lower() != "100-continue":
            shown = expect.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
            response = _json_error(417, f"unsupported Expect header {shown!r}: only 100-continue is known")
            response.force_close()  # a body may or may not follow: the stream has no known boundary
            return response
        return await self._app_handler(request)

    def __call__(self) -> RequestHandler:
        return ClientConnection(self, loop=asyncio.get_running_loop(), header_timeout=self._header_timeout(),
                                **self._handler_args)


# -------------------------------------------------------------------------------- the runner


class Runner(web.AppRunner):
    """The `AppRunner` llmswap serves through: client connections as above, `begin_stop()` for the stop.

    `header_timeout` is read for each new connection (a config reload applies to the next ones)."""

    def __init__(self, app: web.Application, *, header_timeout: Callable[[], float], **kwargs: Any) -> None:
        super().__init__(app, handle_signals=False, access_log=None, **kwargs)
        self._header_timeout = header_timeout
        self.stopping = False

    def begin_stop(self) -> None:
        """From now on every response closes its connection."""
        self.stopping = True

    async def _say_close(self, _: web.BaseRequest, response: web.StreamResponse) -> None:
        if self.stopping:
            # aiohttp derives its Connection header before this hook runs, so say it here as well.
            response.force_close()  # close the connection after this response
            response.headers[hdrs.CONNECTION] = "close"

    async def _make_server(self) -> web.Server:
        self.app.on_response_prepare.append(self._say_close)  # before the app freezes in startup
        made = await super()._make_server()  # runs the app's on_startup hooks
        # llmswap writes its own access log (middleware.access_log); aiohttp's would repeat every line.
        return ConnectionServer(made, self._header_timeout, access_log=None, tcp_keepalive=True)
