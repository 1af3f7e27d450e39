"""A SIGKILLed proxy leaves no upstream behind (Linux parent-death signal)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.helpers.demo import free_port
from tests.integration.process.conftest import WITHIN, is_gone, wait_gone

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
async def test_sigkilled_proxy_leaves_no_upstream_behind() -> None:
    parent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.process.proxy_like",
        str(free_port()),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        start_new_session=True,  # so the cleanup below can reach anything it left, if the test fails
    )
    upstream: int | None = None
    try:
        assert parent.stdout is not None
        line = (await asyncio.wait_for(parent.stdout.readline(), WITHIN)).decode()
        assert line.startswith("upstream pid="), line
        upstream = int(line.split("=", 1)[1])
        assert not is_gone(upstream)

        parent.kill()
        await parent.wait()

        await wait_gone(upstream, within=5.0)
    finally:
        for pid in (parent.pid, upstream):
            if pid is not None:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if parent.returncode is None:
            await parent.wait()
