"""The pure parts of client-connection handling: parser errors → status and message, and the descriptor
warning's rate limit."""

from __future__ import annotations

import errno
import logging
from typing import Any

import pytest
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong, TransferEncodingError

from llmswap.server.http.connections import DescriptorWarnings, parser_error_answer


def test_oversized_heads_are_431_and_other_parser_errors_400() -> None:
    assert parser_error_answer(LineTooLong(b"GET /aaaa", 8190))[0] == 431
    status, message = parser_error_answer(BadHttpMessage("Too many headers received"))
    assert (status, message) == (431, "request header fields too large: Too many headers received")
    status, message = parser_error_answer(TransferEncodingError("Not enough data to satisfy transfer length"))
    assert status == 400 and message.startswith("malformed HTTP request: Not enough data")


class FakeLoop:
    """The two things the handler asks of a loop: the time, and the default handler for the rest."""

    def __init__(self) -> None:
        self.now = 100.0
        self.passed_on: list[dict[str, Any]] = []

    def time(self) -> float:
        return self.now

    def default_exception_handler(self, context: dict[str, Any]) -> None:
        self.passed_on.append(context)


def test_running_out_of_descriptors_warns_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    loop, warnings = FakeLoop(), DescriptorWarnings(interval=30)
    emfile = {"message": "socket.accept() out of resource", "exception": OSError(errno.EMFILE, "Too many")}
    with caplog.at_level(logging.WARNING, logger="llmswap.server"):
        for _ in range(500):
            warnings(loop, emfile)  # type: ignore[arg-type]
        loop.now += 31
        warnings(loop, emfile)  # type: ignore[arg-type]
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines
    assert "1 times since the last warning" in lines[0] and "500 times since the last warning" in lines[1]
    assert not any(record.exc_info for record in caplog.records)
    assert loop.passed_on == []


def test_other_loop_errors_go_to_the_default_handler() -> None:
    loop, warnings = FakeLoop(), DescriptorWarnings()
    other = {"message": "boom", "exception": ValueError("x")}
    warnings(loop, other)  # type: ignore[arg-type]
    assert loop.passed_on == [other]
