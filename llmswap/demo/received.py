"""What reached the demo: each request read once into a ``Received`` value.

Handlers take the body from here, ``--log-requests`` prints from here and ``--echo`` sends it back, so a proxy
test sees exactly the method, path, query, headers and body the upstream got.
"""

import json
from dataclasses import dataclass
from urllib.parse import parse_qsl

from aiohttp import web

_KEY = "llmswap.demo.received"


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    # Parsed JSON (whatever the Content-Type says, as llama-server does); a form as {field: text, or
    # {"filename", "content_type", "size"} for a file}; anything else as text; None for an empty body.
    body: object
    body_error: str | None  # why the body is not JSON, when it looked like it should be
    model: str | None  # the `model` the client named, in the body, the form or the query

    def echo(self) -> dict[str, object]:
        return {
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "headers": self.headers,
            "body": self.body,
        }


async def received(request: web.Request) -> Received:
    """The request as read, reading the body on first use."""
    cached = request.get(_KEY)
    if isinstance(cached, Received):
        return cached
    body, body_error = await _read_body(request)
    model = body.get("model") if isinstance(body, dict) else None
    if not isinstance(model, str):
        model = request.query.get("model")
    value = Received(
        method=request.method,
        path=request.path,
        query=dict(request.query),
        headers=dict(request.headers),
        body=body,
        body_error=body_error,
        model=model,
    )
    request[_KEY] = value
    return value


async def _read_body(request: web.Request) -> tuple[object, str | None]:
    if request.content_type == "multipart/form-data":
        form: dict[str, object] = {}
        for name, value in (await request.post()).items():
            if isinstance(value, web.FileField):
                size = value.file.seek(0, 2)
                value.file.seek(0)
                form[name] = {"filename": value.filename, "content_type": value.content_type, "size": size}
            else:
                form[name] = value
        return form, None
    raw = await request.read()
    if not raw:
        return None, None
    text = raw.decode("utf-8", errors="replace")
    try:
        return json.loads(text), None
    except ValueError as exc:
        if request.content_type == "application/x-www-form-urlencoded":
            return dict(parse_qsl(text, keep_blank_values=True)), None
        return text, f"the request body is not valid JSON ({exc})"
