"""The one middleware every request passes (`gate`), and the access record it keeps.

In one frame, outermost first: the access record and line (and the request observers, e.g. metrics), the
error shaping, the guard (`llmswap.server.http.guard.screen`: Host, Origin, CORS preflights) and auth
(`llmswap.server.http.auth.admit`: API keys), then the route. Each of those modules owns its own decisions;
this one only calls them in order, so a request that needs no work (no Origin, no `apiKeys`) costs none.
The error shaping turns anything a route or aiohttp itself raises (404/405 from the router, 413 from the
body limit, a bug) into llmswap's error envelope, so no client ever sees aiohttp's HTML page or a
traceback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple, Protocol

from aiohttp import hdrs, web
from yarl import URL

from llmswap.activity.recording import RequestRecord
from llmswap.server.http import auth, guard
from llmswap.server.http.errors import error_response
from llmswap.server.observe.logsetup import deliver_line
from llmswap.server.state import STATE
from llmswap.tasks.queue.sql import TaskDatabaseUnavailable

access_logger = logging.getLogger("llmswap.access")
log = logging.getLogger("llmswap.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Never sent: marks, in the access log, a response the client did not stay for.
CLIENT_GONE = 499


class Answered(NamedTuple):
    """What the request observers learn about one answered request, so observers never see a framework's
    request object.

    A NamedTuple: as immutable as a frozen dataclass (every observer sees the same facts), for a third of
    a frozen dataclass's making (one is made for every request)."""

    method: str
    path: str
    route: str  # the route's pattern (`/logs/stream/{log_id}`), UNMATCHED_ROUTE when none matched
    remote: str | None
    model: str
    status: int  # CLIENT_GONE when the client left first
    seconds: float  # arrival to the end of the answer
    waited: float | None = None  # see RequestRecord
    load: float | None = None
    first_byte: float | None = None
    cut: str = ""  # see RequestRecord
    phases: tuple[tuple[str, float], ...] = ()
    cached: int | None = None
    placed: str = ""
    from_page: bool = False  # asked by llmswap's own status page (its Referer is /ui)


UNMATCHED_ROUTE = "unmatched"

# The request's record (`llmswap.activity.recording.RequestRecord`), made here as the request arrives. A
# mutable object, so a cloned request (auth clones to drop credentials) shares it with the original.
RECORD: web.RequestKey[RequestRecord] = web.RequestKey("llmswap_record", RequestRecord)


def request_record(request: web.BaseRequest) -> RequestRecord:
    """The request's record, for its route to take once and hand down (nothing below the route reaches
    back for it). A request this middleware did not frame, as in a test calling a route directly, gets a
    fresh one that nothing reads."""
    record = request.get(RECORD)
    return record if isinstance(record, RequestRecord) else RequestRecord(started=time.monotonic())

# Told about every request once it is answered. Must not block.
RequestObserver = Callable[[Answered], None]
REQUEST_OBSERVERS: web.AppKey[list[RequestObserver]] = web.AppKey("llmswap_request_observers", list)


class Timings(Protocol):
    """Where a request's time went, as a RequestRecord or an Answered tells it."""

    @property
    def waited(self) -> float | None: ...
    @property
    def load(self) -> float | None: ...
    @property
    def first_byte(self) -> float | None: ...
    @property
    def cut(self) -> str: ...
    @property
    def phases(self) -> tuple[tuple[str, float], ...]: ...
    @property
    def cached(self) -> int | None: ...
    @property
    def placed(self) -> str: ...


def access_line(remote: str | None, method: str, path: str, status: int, seconds: float, model: str,
                record: Timings | None = None) -> str:
    """One access-log line. The path only: query strings and headers may carry secrets.

    A request that waited for a model also says where its time went (OC-CORE-1040): `queue` (waiting
    for its turn), `load` (its model loading), `ttfb` (arrival to the first byte sent) and `decode`
    (first byte to the end of the answer); a load names the phases of its swap (`phases=drain:..,stop:..,
    start:..`: waiting for the victims' requests, saving their KV caches, stopping them, reading the next
    model's files, starting it, restoring its KV cache, or waking it), and `cached` how many prompt tokens
    the upstream took from its cache (when its answer says). A request llmswap ended itself says why:
    `cut=shutdown`."""
    outcome = "client gone" if status == CLIENT_GONE else status
    line = f'{remote or "-"} "{method} {path}" {outcome} {seconds * 1000:.1f}ms'
    if model:
        line += f" model={model}"
    waited = record.waited if record is not None else None
    if waited is not None:
        load = record.load or 0.0  # type: ignore[union-attr]
        queue = waited - load
        line += f" queue={(queue if queue > 0.0 else 0.0) * 1000:.1f}ms load={load * 1000:.1f}ms"
        phases = record.phases  # type: ignore[union-attr]
        if phases:
            line += " phases=" + ",".join(f"{name}:{seconds * 1000:.1f}ms" for name, seconds in phases)
        first_byte = record.first_byte  # type: ignore[union-attr]
        if first_byte is not None:
            decode = seconds - first_byte
            line += f" ttfb={first_byte * 1000:.1f}ms decode={(decode if decode > 0.0 else 0.0) * 1000:.1f}ms"
    if record is not None and record.cached is not None:
        line += f" cached={record.cached}"
    if record is not None and record.cut:
        line += f" cut={record.cut}"
    if record is not None and record.placed:
        line += f' placed="{record.placed}"'

    return line


QUIET_ANSWERS = frozenset({(200, "/health"), (200, "/wol-health"), (404, "/favicon.ico")})


def report(answered: Answered, observers: Sequence[RequestObserver]) -> None:
    """Write the access line of an answered request (formatted only when the access log takes its level)
    and tell the observers. Health probes that pass (a container's, a monitor's: every few seconds), a
    browser's favicon request llmswap has no icon for, and what an open status page asks for itself (its
    polling, about one request a second) are debug lines, unless they fail."""
    page_poll = answered.from_page and answered.status < 400
    quiet = page_poll or (answered.status, answered.path) in QUIET_ANSWERS
    level = logging.DEBUG if quiet else logging.INFO
    if access_logger.isEnabledFor(level):
        line = access_line(answered.remote, answered.method, answered.path, answered.status,
                           answered.seconds, answered.model, answered)
        deliver_line(access_logger, level, line)
    for observe in observers:
        try:
            observe(answered)
        except Exception:
            log.exception("request observer failed for %s %s", answered.method, answered.path)


@web.middleware
async def gate(request: web.Request, handler: Handler) -> web.StreamResponse:
    """llmswap's one middleware: access record, error shaping, guard, auth, route (see the module's doc)."""
    started = time.monotonic()
    record = RequestRecord(started=started)
    request[RECORD] = record
    status = CLIENT_GONE  # what remains if the handler is cancelled: the client left
    try:
        try:
            server = request.app[STATE]
            response: web.StreamResponse | None = guard.screen(
                request, server.config, loopback_listener=server.loopback_listener)
            if response is None:
                keys = server.config.api_keys
                if not keys:  # auth is off: nothing to look up, nothing to strip
                    response = await handler(request)
                else:
                    admitted = auth.admit(request, keys)
                    response = admitted if isinstance(admitted, web.Response) else await handler(admitted)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise  # redirects and other non-errors pass as aiohttp built them
            response = error_response(request, exc.status, _http_error_message(request, exc),
                                      headers=_kept(exc))
        except web.RequestPayloadError as exc:
            response = _unreadable_body(request, exc)
        except TaskDatabaseUnavailable as exc:  # a shared queue's database is down: not the request's fault
            log.warning("%s %s: %s", request.method, request.path, exc)
            response = error_response(request, 503, str(exc), retry_after=exc.retry_after)
        except ConnectionError:
            if _client_gone(request):
                log.debug("%s %s: the client went away before the response was complete",
                          request.method, request.path)
                response = _abandoned(request, CLIENT_GONE)
            else:
                response = _internal_error(request)
        except Exception:
            response = _internal_error(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    except Exception:
        status = 500  # shaping the error failed too: aiohttp answers it
        raise
    finally:
        observers: list[RequestObserver] = request.app.get(REQUEST_OBSERVERS, [])
        report(Answered(request.method, request.path, route_label(request), request.remote, record.model,
                        status, time.monotonic() - started, record.waited, record.load, record.first_byte,
                        record.cut, record.phases, record.cached, record.placed, _from_page(request)),
               observers)


def _from_page(request: web.BaseRequest) -> bool:
    """Whether the status page itself asked (a fetch from /ui sends it as its Referer)."""
    referer = request.headers.get(hdrs.REFERER, "")
    return bool(referer) and URL(referer).path.startswith("/ui")


def route_label(request: web.BaseRequest) -> str:
    """The route's pattern, so paths with ids in them do not each become a series of their own."""
    route = getattr(getattr(request, "match_info", None), "route", None)
    resource = route.resource if route is not None else None
    return resource.canonical if resource is not None else UNMATCHED_ROUTE


def _unreadable_body(request: web.Request, exc: web.RequestPayloadError) -> web.StreamResponse:
    # The body could not be read as sent (bad chunking, a Content-Encoding it is not in): the client's
    # fault, and the rest of the connection cannot be trusted to start at a request boundary.
    log.info("%s %s: unreadable request body from %s: %s", request.method, request.path, request.remote,
             payload_error_text(exc))
    response = error_response(request, 400, f"the request body cannot be read: {payload_error_text(exc)}")
    response.force_close()
    return response


def payload_error_text(exc: BaseException) -> str:
    """aiohttp's parser errors read `400, message:\\n  <why>`; the why alone."""
    text = getattr(exc, "message", None) or str(exc)
    return " ".join(str(text).split()) or type(exc).__name__


def _internal_error(request: web.Request) -> web.StreamResponse:
    log.exception("internal error while handling %s %s", request.method, request.path)
    if request.writer is not None and request.writer.output_size > 0:
        # Part of the answer is out already; a second status line would corrupt it. Cutting the
        # connection is the one signal left that the response is incomplete.
        return _abandoned(request, 500)
    return error_response(
        request, 500, f"internal error while handling {request.method} {request.path}; "
        "the proxy log (/logs) has the details",
    )


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def _abandoned(request: web.Request, status: int) -> web.StreamResponse:
    """A response for a connection that is (now) closed: aiohttp's attempt to send it fails quietly, and
    the access log still records `status`."""
    transport = request.transport
    if transport is not None:
        transport.close()
    return web.Response(status=status)


def _kept(exc: web.HTTPException) -> dict[str, str]:
    # The exception's own headers (Allow on a 405, Retry-After...) survive; the body's do not.
    return {k: v for k, v in exc.headers.items() if k.lower() not in ("content-type", "content-length")}


def too_large_message(limit: int) -> str:
    """The 413 message for a body over `maxRequestBodySize` (`limit` bytes)."""
    mib = 1024 * 1024
    size = f"{limit // mib} MiB" if limit >= mib and limit % mib == 0 else f"{limit} bytes"
    return (f"the request body is larger than the {size} llmswap accepts; raise maxRequestBodySize in the "
            "config to allow it")


def _http_error_message(request: web.Request, exc: web.HTTPException) -> str:
    custom = exc.text if exc.text and exc.text != f"{exc.status}: {exc.reason}" else ""
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return too_large_message(request.client_max_size)  # the limit aiohttp enforced
    if custom:
        return custom
    if isinstance(exc, web.HTTPNotFound):
        return f"404 page not found: no route for {request.method} {request.path}"
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        return f"method {request.method} is not allowed on {request.path}; use {allowed}"
    return exc.reason


def setup(app: web.Application) -> None:
    """Start the (empty) list of request observers."""
    app[REQUEST_OBSERVERS] = []
