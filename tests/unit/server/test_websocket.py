"""Pure parts of the websocket relay: recognising an upgrade; the close code passed to the other side."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from llmswap.server.inference.websocket import GOING_AWAY, is_upgrade, relayable_close_code


@pytest.mark.parametrize(
    ("method", "headers", "expected"),
    [
        ("GET", {"Upgrade": "websocket", "Connection": "Upgrade"}, True),
        ("GET", {"Upgrade": "WebSocket", "Connection": "keep-alive, Upgrade"}, True),  # Firefox's form
        ("GET", {"Upgrade": "websocket", "Connection": "keep-alive"}, False),
        ("GET", {"Upgrade": "h2c", "Connection": "Upgrade"}, False),
        ("POST", {"Upgrade": "websocket", "Connection": "Upgrade"}, False),
        ("GET", {}, False),
    ],
)
def test_is_upgrade(method: str, headers: dict[str, str], expected: bool) -> None:
    assert is_upgrade(make_mocked_request(method, "/upstream/m/ws", headers=headers)) is expected


@pytest.mark.parametrize(
    ("code", "relayed"),
    [
        (1000, 1000), (1001, 1001), (1003, 1003), (1008, 1008), (1011, 1011), (4001, 4001), (3000, 3000),
        # Reported locally only, never sent in a close frame: the other side went away.
        (1005, GOING_AWAY), (1006, GOING_AWAY), (1015, GOING_AWAY), (None, GOING_AWAY),
        # Not valid on the wire at all.
        (999, GOING_AWAY), (1004, GOING_AWAY), (2000, GOING_AWAY), (5000, GOING_AWAY),
    ],
)
def test_relayable_close_code(code: int | None, relayed: int) -> None:
    assert relayable_close_code(code) == relayed
