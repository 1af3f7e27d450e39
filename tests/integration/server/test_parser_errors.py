"""Requests aiohttp's own parser refuses (too many headers, a header too long, broken chunking, garbage)
are answered in OpenAI's error envelope — JSON, 400 or 431 — over raw sockets, with no traceback logged."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from tests.helpers.models import demo_config, exclusive_config
from tests.integration.server.conftest import ServeConfig, Served


async def exchange(served: Served, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `raw` on a fresh connection and read the answer until the server closes it."""
    port = int(served.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 15)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    pairs = (line.split(":", 1) for line in lines[1:] if ":" in line)
    headers = {name.strip().lower(): value.strip() for name, value in pairs}
    return int(lines[0].split(" ")[1]), headers, body


def envelope(headers: dict[str, str], body: bytes) -> dict[str, Any]:
    assert headers.get("content-type", "").startswith("application/json"), headers
    if headers.get("transfer-encoding") == "chunked":
        size, _, rest = body.partition(b"\r\n")
        body = rest[: int(size, 16)]
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return dict(error)


HOST = b"Host: 127.0.0.1\r\n"  # a loopback name: the Host check lets it through
HEALTH = b"GET /health HTTP/1.1\r\n" + HOST
CASES = {
    "too many headers": (
        HEALTH + b"".join(b"X-H%d: v\r\n" % i for i in range(300)) + b"\r\n",
        431,
    ),
    "a header too long": (HEALTH + b"X-Big: " + b"a" * 20_000 + b"\r\n\r\n", 431),
    "a request line too long": (b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 431),
    "a bad header line": (HEALTH + b"no colon here\r\n\r\n", 400),
    "bad chunk framing": (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        400,
    ),
    "an Expect other than 100-continue": (HEALTH + b"Expect: nope\r\n\r\n", 417),
    "an Expect that is not UTF-8": (b"GET /api/tasks/1 HTTP/1.1\r\n" + HOST + b"Expect: \x80\r\n\r\n", 417),
    "conflicting lengths": (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        400,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_requests_the_parser_refuses_get_the_error_envelope(
    serve_config: ServeConfig, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    raw, expected = CASES[case]
    with caplog.at_level(logging.DEBUG):
        status, headers, body = await exchange(served, raw)
    assert status == expected, (case, status, body[:200])
    error = envelope(headers, body)
    assert error["type"] == "invalid_request_error", error
    tracebacks = [record.getMessage() for record in caplog.records if record.exc_info]
    assert not tracebacks, tracebacks


async def test_an_unread_body_that_cannot_be_decoded_logs_no_traceback(
    serve_config: ServeConfig, caplog: pytest.LogCaptureFixture
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    raw = (HEALTH + b"Connection: close\r\nContent-Encoding: gzip\r\n"
           b"Content-Length: 12\r\n\r\nnot gzipped!")  # /health never reads it; aiohttp drains it after
    with caplog.at_level(logging.DEBUG):
        status, _, _ = await exchange(served, raw)
    assert status == 200
    tracebacks = [record.getMessage() for record in caplog.records if record.exc_info]
    assert not tracebacks, tracebacks
