"""Where worker processes cannot serve, `--workers` is ignored with the reason: a TLS listener (a TLS session
cannot move between processes) and any system but Linux (connections move as Linux passes descriptors)."""

from __future__ import annotations

import sys

import pytest

from llmswap.server.workers import workers_unavailable


def test_plain_tcp_on_linux_takes_workers() -> None:
    assert workers_unavailable(tls=False, platform="linux") is None


def test_tls_turns_them_off_and_says_why() -> None:
    reason = workers_unavailable(tls=True, platform="linux")
    assert reason is not None and "TLS connection cannot move between processes" in reason


@pytest.mark.parametrize("platform", ["darwin", "freebsd14", "win32"])
def test_other_systems_turn_them_off_and_name_themselves(platform: str) -> None:
    reason = workers_unavailable(tls=False, platform=platform)
    assert reason is not None and "need Linux" in reason and platform in reason


def test_the_default_is_this_system() -> None:
    assert workers_unavailable(tls=False) == workers_unavailable(tls=False, platform=sys.platform)
