"""Putting a response on the front's wire: the head as aiohttp sends it (its Date and Server headers, the
app's `on_response_prepare` hooks run first — CORS, the in-flight entry, `Connection: close` once
stopping), then the body framed by its Content-Length or chunked."""

from __future__ import annotations

from typing import Protocol

from aiohttp import hdrs, web
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE

from llmswap.server.front.request import FrontRequest


class Wire(Protocol):
    """The connection a response is written to (`FrontConnection`)."""

    closing: bool

    def write(self, data: bytes | bytearray | memoryview) -> None: ...

    async def drain(self) -> None: ...


def _empty_body(status: int) -> bool:
    return status < 200 or status in (204, 304)


async def prepared_head(request: FrontRequest, response: web.StreamResponse, wire: Wire
                        ) -> tuple[bytes, bool]:
    """Run the app's response hooks on `response`, then its head (bytes) and whether its body is chunked.
    A response that is not to be kept alive marks the connection `closing`, and one on a connection already
    `closing` (the server or worker stops) says `Connection: close`."""
    await request.app.on_response_prepare.send(request, response)  # type: ignore[arg-type]
    keep_alive = request.keep_alive and response.keep_alive is not False and not wire.closing
    headers = response.headers
    status = response.status
    chunked = False
    if _empty_body(status):
        headers.popall(hdrs.TRANSFER_ENCODING, None)
    else:
        if hdrs.CONTENT_LENGTH not in headers:
            chunked = True
            headers[hdrs.TRANSFER_ENCODING] = "chunked"
        if headers.get(hdrs.CONTENT_LENGTH) != "0":
            headers.setdefault(hdrs.CONTENT_TYPE, "application/octet-stream")
    if hdrs.DATE not in headers:
        headers[hdrs.DATE] = rfc822_formatted_time()
    headers.setdefault(hdrs.SERVER, SERVER_SOFTWARE)
    if not keep_alive:
        wire.closing = True
        headers.setdefault(hdrs.CONNECTION, "close")
    lines = [f"HTTP/1.1 {status} {response.reason}"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"a response header may not contain CR or LF: {name!r}")
        lines.append(f"{name}: {value}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("utf-8"), chunked


async def send_whole(request: FrontRequest, response: web.Response, wire: Wire) -> web.Response:
    """Send a response llmswap made itself (an error in the envelope) in one write."""
    body = response.body if isinstance(response.body, bytes) else b""
    if not _empty_body(response.status):
        response.headers[hdrs.CONTENT_LENGTH] = str(len(body))
    head, _ = await prepared_head(request, response, wire)
    wire.write(head + body)
    await wire.drain()
    return response


class BodyWriter:
    """Writes a relayed body to the wire, in chunked framing when the head said so. The head goes out with
    the first piece of the body (one write, one system call, for a small answer)."""

    def __init__(self, wire: Wire, head: bytes, chunked: bool) -> None:
        self.wire = wire
        self.chunked = chunked
        self._pending = head

    async def write(self, data: bytes) -> None:
        framed = b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data
        if self._pending:
            framed, self._pending = self._pending + framed, b""
        self.wire.write(framed)
        await self.wire.drain()

    def end(self) -> None:
        ending = self._pending + (b"0\r\n\r\n" if self.chunked else b"")
        self._pending = b""
        if ending:
            self.wire.write(ending)
