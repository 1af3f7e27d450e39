"""How the demo answers: errors in the client's API dialect, and SSE streams flushed event by event."""

import json
from collections.abc import Mapping

from aiohttp import web


class BadRequest(Exception):
    """A request the demo cannot serve; becomes a 400 whose message names the field and what is accepted."""


def error_body(path: str, status: int, message: str) -> dict[str, object]:
    """An error in the shape the caller's SDK parses: Anthropic's for /v1/messages, OpenAI's otherwise."""
    kind = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "api_error")
    if path.startswith("/v1/messages"):
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "code": status}}


class EventStream:
    """A server-sent-events response; every event goes to the socket as soon as it is sent."""

    def __init__(self, response: web.StreamResponse) -> None:
        self.response = response

    @classmethod
    async def open(cls, request: web.Request) -> "EventStream":
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        )
        await response.prepare(request)
        return cls(response)

    async def send(self, data: Mapping[str, object] | str, event: str | None = None) -> None:
        payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
        prefix = f"event: {event}\n" if event else ""
        await self.response.write(f"{prefix}data: {payload}\n\n".encode())

    async def close(self) -> web.StreamResponse:
        await self.response.write_eof()
        return self.response
