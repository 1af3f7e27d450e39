"""The keeper of an upstream's process group: it ends the whole group (grandchildren included) once its
owner is SIGKILLed, escalates to SIGKILL after its grace, and otherwise leaves the group alone — when stood
down after a normal stop, or once the group is gone by itself."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from llmswap.process.keeper import start_keeper
from tests.integration.process.conftest import WITHIN, is_gone, poll_until, wait_gone

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="process groups are POSIX")


def members(pgid: int) -> list[int]:
    """The live processes of group `pgid`."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.NoSuchProcess):
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process.pid)
    return found


@contextlib.asynccontextmanager
async def owner_of(script: str, grace: float) -> AsyncIterator[tuple[asyncio.subprocess.Process, int, int]]:
    """A stand-in llmswap holding a keeper for `sh -c script`: (its process, the group id, the keeper pid)."""
    owner = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.integration.process.keeper_owner", str(grace), script,
        cwd=REPO, stdout=asyncio.subprocess.PIPE, start_new_session=True,
    )
    group = None
    try:
        assert owner.stdout is not None
        line = (await asyncio.wait_for(owner.stdout.readline(), WITHIN)).decode()
        fields = dict(part.split("=") for part in line.split())
        group, keeper = int(fields["group"]), int(fields["keeper"])
        yield owner, group, keeper
    finally:
        for pgid in (owner.pid, group):
            if pgid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
        if owner.returncode is None:
            await owner.wait()


async def test_a_sigkilled_owner_takes_the_whole_group_with_it() -> None:
    async with owner_of("sleep 600 & sleep 600 & wait", grace=5.0) as (owner, group, keeper):
        await poll_until(lambda: len(members(group)) == 3)  # sh and both sleeps
        grandchildren = [pid for pid in members(group) if pid != group]
        owner.kill()
        await owner.wait()
        for pid in grandchildren:
            await wait_gone(pid)
        await wait_gone(keeper)
        assert members(group) == []


async def test_a_grandchild_ignoring_sigterm_is_killed_after_the_grace() -> None:
    async with owner_of("trap '' TERM; sleep 600 & wait", grace=0.2) as (owner, group, keeper):
        await poll_until(lambda: len(members(group)) == 2)
        stubborn = next(pid for pid in members(group) if pid != group)
        owner.kill()
        await owner.wait()
        await wait_gone(stubborn)
        await wait_gone(keeper)


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "600"], start_new_session=True)


async def test_a_stood_down_keeper_exits_and_leaves_the_group_alone() -> None:
    group = sleeper()
    try:
        keeper = start_keeper(group.pid, grace=0.1)
        assert keeper is not None
        keeper.stand_down()
        await wait_gone(keeper.pid)
        assert group.poll() is None  # the normal stop is llmswap's, not the keeper's
    finally:
        group.kill()
        group.wait()


async def test_a_keeper_leaves_once_its_group_is_gone() -> None:
    group = sleeper()
    keeper = start_keeper(group.pid, grace=0.1)
    assert keeper is not None
    group.kill()
    group.wait()
    await wait_gone(keeper.pid)
    keeper.stand_down()  # the usual call after a stop: harmless when the keeper already left
    assert is_gone(keeper.pid)
