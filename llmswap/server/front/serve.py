"""Serving one fast request: what the aiohttp route and its middleware do for it, by the same owners.

The access record, the access line and the request observers (`middleware.report`, an `Answered`), the
activity recording (`activity_api.begin_http`/`finish_http`), the in-flight entry and its cancel
(`inflight`, `cancel`), the model's lease from the dispatcher (the scheduler counts it in flight;
`concurrencyLimit`, queueing, deadlines and admission errors are the router's, answered by
`scheduler_error_response`), the context the upstream reports (`guardrails`), then `relay`. A client that
hangs up cancels the task running this (`FrontConnection.connection_lost`): the request leaves the queue,
or its upstream request is closed, and the access log says `client gone`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from aiohttp import web

from llmswap.dispatch.dispatcher import Lease
from llmswap.scheduler.errors import Preempted, SchedulerError
from llmswap.server import guardrails
from llmswap.server.activity_api import begin_http, finish_http
from llmswap.server.cancel import CANCELLED_STATUS, cancelled_message
from llmswap.server.errors import error_response, scheduler_error_response
from llmswap.server.front.relay import Connection, Served, relay
from llmswap.server.front.request import FastPlan, FrontRequest
from llmswap.server.front.wire import send_whole
from llmswap.server.inflight import tracker_of
from llmswap.server.middleware import ACCESS, CLIENT_GONE, REQUEST_OBSERVERS, AccessRecord, Answered, report
from llmswap.server.proxy import CLIENT_CLOSED_REQUEST, dispatcher
from llmswap.workers.grants import Shown
from llmswap.workers.leases import REMOTE_LEASES, RemoteLeases

log = logging.getLogger("llmswap.server")


async def serve_fast(conn: Connection, request: FrontRequest, plan: FastPlan) -> None:
    """Answer `request` as planned; the access log and the observers hear of it however it ends."""
    # The front's own access record: it sets its fields itself (the note_* helpers are for handlers that
    # only hold the request).
    record = AccessRecord(model=plan.model.id, started=request.started)
    request[ACCESS] = record
    status = CLIENT_GONE  # what remains if the client leaves or the server cuts the request
    try:
        status = (await _serve(conn, request, plan, record)).status
    except ConnectionError:
        conn.cut()
    except Exception:
        status = 500
        log.exception("internal error while handling POST %s", request.path)
        if record.answering:
            conn.cut()  # part of the answer is out: a second status line would corrupt it
        else:
            message = (f"internal error while handling POST {request.path}; the proxy log (/logs) has the "
                       "details")
            try:
                await send_whole(request, error_response(request, 500, message), conn)  # type: ignore[arg-type]
            except ConnectionError:
                conn.cut()
    finally:
        # The route's pattern is its path: every fast route is a plain one.
        report(Answered(request.method, request.path, plan.route.path, request.remote, record.model, status,
                        time.monotonic() - record.started, record.waited, record.load, record.first_byte),
               request.app[REQUEST_OBSERVERS])


async def _serve(conn: Connection, request: FrontRequest, plan: FastPlan, record: AccessRecord
                 ) -> web.StreamResponse:
    """One frame for the request in flight, as `cancel.served` is on the aiohttp path: its in-flight entry,
    a cancel of that entry turned into a clean end, its recording finished with what was answered."""
    model = plan.model
    recording = begin_http(request, model=model.id, requested=plan.requested,  # type: ignore[arg-type]
                           req_path=plan.route.upstream_path)
    task = asyncio.current_task()
    tracker = tracker_of(plan.state)
    entry = tracker.open(request, model.id, None, task)  # type: ignore[arg-type]
    response: web.StreamResponse | None = None
    try:
        response = await _leased(conn, request, plan, Served(record, recording, entry))
        return response
    except asyncio.CancelledError:
        if not entry.cancelled or conn.gone or task is None:
            raise  # the client left, or the server is stopping
        task.uncancel()
        message = cancelled_message(entry.label or entry.id)
        log.info("%s %s: %s", request.method, request.path, message)
        recording.fail(CANCELLED_STATUS, message)
        if record.answering:
            conn.cut()  # never a complete-looking truncated body
            response = web.Response(status=CANCELLED_STATUS)
        else:
            response = await send_whole(request, error_response(request, CANCELLED_STATUS, message), conn)  # type: ignore[arg-type]
        return response
    finally:
        tracker.close(entry)
        finish_http(recording, response)


async def _leased(conn: Connection, request: FrontRequest, plan: FastPlan, served: Served
                  ) -> web.StreamResponse:
    model_id = plan.model.id
    record = served.record
    remote: RemoteLeases | None = plan.state.extras.get(REMOTE_LEASES)
    if remote is not None:  # a worker process: main's scheduler grants it
        return await _leased_remotely(conn, request, plan, served, remote)
    try:
        leases = dispatcher(plan.state)
        held = leases.lease_now(model_id, plan.asking, origin="http", router=plan.router)
        if held is None:  # it must wait (loading, busy, queued, a deadline): the router's queue
            asking = replace(plan.asking, on_granted=record.loaded)
            async with leases.lease(model_id, asking, origin="http", router=plan.router) as lease:
                return await _granted(conn, request, plan, lease, served)
        record.load = 0.0  # granted at once: nothing loaded for it
        with held:
            return await _granted(conn, request, plan, held.lease, served)
    except SchedulerError as err:
        return await _refused(conn, request, served, err)


async def _refused(conn: Connection, request: FrontRequest, served: Served, err: SchedulerError
                   ) -> web.StreamResponse:
    """The router's refusal (or preemption) of the request, answered as the aiohttp route answers it."""
    served.recording.fail(err.status, err.message)
    if isinstance(err, Preempted) and served.record.answering:
        conn.cut()  # preempted mid-answer: a truncated answer must not pass for a complete one
        return web.Response(status=CLIENT_CLOSED_REQUEST)
    return await send_whole(request, scheduler_error_response(request, err), conn)  # type: ignore[arg-type]


async def _leased_remotely(conn: Connection, request: FrontRequest, plan: FastPlan, served: Served,
                           remote: RemoteLeases) -> web.StreamResponse:
    headers = tuple((str(name), value) for name, value in request.headers.items())  # plain str for marshal
    shown = Shown(request.method, request.path, headers, request.remote)
    entry = served.entry

    def cancel(shown_id: str | None) -> None:  # main's in-flight cancel is this process's own: a clean end
        entry.label = shown_id  # that names the request as main's list shows it
        tracker_of(plan.state).cancel(entry.id)

    try:
        async with remote.lease(plan.model, plan.asking, shown, cancel, served.record.loaded) as lease:
            return await _granted(conn, request, plan, lease, served)
    except SchedulerError as err:
        return await _refused(conn, request, served, err)


async def _granted(conn: Connection, request: FrontRequest, plan: FastPlan, lease: Lease, served: Served
                   ) -> web.StreamResponse:
    record = served.record
    record.waited = waited = lease.waited
    load = record.load or 0.0
    served.recording.waited(max(0.0, waited - load), load or None)
    await guardrails.learn_reported_context(request.app, lease.config, lease.upstream)
    return await relay(conn, request, plan, lease, served)
