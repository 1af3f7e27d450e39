"""The upstream HTTP/1.1 client on uvloop (`llmswap --event-loop uvloop`, or auto when it is installed)."""

from __future__ import annotations

import pytest

from llmswap.config.model import Timeouts
from llmswap.dispatch.http1 import Upstream
from llmswap.dispatch.pool import send
from tests.helpers.scripted_upstream import answer_each, scripted, url


def test_keep_alive_reuse_works_on_uvloop_whose_transports_are_no_asyncio_subclass() -> None:
    # `llmswap --event-loop uvloop` (or auto): uvloop's TCP transport is not an asyncio.Transport
    # subclass. An isinstance check once refused every connection, so each request failed and no
    # connection was reused.
    uvloop = pytest.importorskip("uvloop")

    async def exchange() -> int:
        async with scripted(answer_each) as up:
            pool = Upstream(Timeouts())
            for _ in range(3):
                async with await send(pool, "POST", url(up), {}, b"{}", 5.0) as answer:
                    assert await answer.read() == b"hello"
            return up.connections

    assert uvloop.run(exchange()) == 1

