"""Error responses in OpenAI's envelope, as every route answers them.

`{"error": {"message", "type", "param", "code"}}` by default; plain text (`llmswap: <message>`) when the
client asks for text, a small page when it asks for HTML. Type and code follow the status the way
llama-swap maps them, so clients written against it behave the same.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping

from aiohttp import web

from llmswap.scheduler.errors import SchedulerError

_TYPES: Mapping[int, tuple[str, str]] = {
    400: ("invalid_request_error", "bad_request"),
    401: ("authentication_error", "unauthorized"),
    403: ("authentication_error", "forbidden"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    409: ("invalid_request_error", "conflict"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    502: ("server_error", "bad_gateway"),
    503: ("server_error", "service_unavailable"),
    504: ("server_error", "gateway_timeout"),
}


def error_type(status: int) -> tuple[str, str]:
    """(type, code) for a status, llama-swap's table with the generic fallbacks."""
    if status in _TYPES:
        return _TYPES[status]
    if 400 <= status < 500:
        return "invalid_request_error", "invalid_request"
    return "server_error", "internal_error"


def error_body(status: int, message: str, *, code: str | None = None, param: str | None = None) -> bytes:
    kind, default_code = error_type(status)
    body = {"error": {"message": message, "type": kind, "param": param, "code": code or default_code}}
    return json.dumps(body).encode()


def error_response(
    request: web.BaseRequest | None,
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    retry_after: float | None = None,
    headers: Mapping[str, str] | None = None,
    force_json: bool = False,
) -> web.Response:
    """An error answer shaped by the client's Accept header (JSON unless it asks for text or HTML)."""
    extra = dict(headers or {})
    if retry_after is not None:
        extra["Retry-After"] = str(max(1, math.ceil(retry_after)))
    accept = request.headers.get("Accept", "") if request is not None else ""
    if not force_json and "application/json" not in accept:
        if "text/plain" in accept:
            return web.Response(status=status, text=f"llmswap: {message}\n", headers=extra)
        if "text/html" in accept:
            page = f"<!doctype html><title>{status}</title><h1>{status}</h1><p>{html.escape(message)}</p>\n"
            return web.Response(status=status, text=page, content_type="text/html", headers=extra)
    return web.Response(
        status=status, body=error_body(status, message, code=code, param=param),
        content_type="application/json", headers=extra,
    )


def scheduler_error_response(request: web.BaseRequest | None, err: SchedulerError) -> web.Response:
    """The answer for an error the router handed a waiting request."""
    # llama-swap always answers its 429 in JSON: clients back off on the body's code, not on HTML.
    return error_response(
        request, err.status, err.message, code=err.code, retry_after=err.retry_after,
        force_json=err.status == 429,
    )


def sse_error_event(status: int, message: str, *, code: str | None = None) -> bytes:
    """An error as one SSE event, for streams whose 200 status was already sent."""
    return b"data: " + error_body(status, message, code=code) + b"\n\n"
