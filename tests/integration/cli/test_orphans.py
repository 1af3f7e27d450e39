"""A real llmswap killed with SIGKILL leaves nothing of an upstream's process tree behind: not the direct
child (parent-death signal) and not what it forked (`sh -c 'server & wait'`), which the keeper ends."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import aiohttp
import psutil
import pytest

from tests.helpers.cli import WITHIN, alive, demo_model, running_llmswap, write_config
from tests.helpers.wait import eventually

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the guarantee is Linux's")


def keepers(pid: int) -> list[int]:
    """The keepers among the live children of `pid`."""
    return [child.pid for child in psutil.Process(pid).children()
            if child.status() != psutil.STATUS_ZOMBIE and any("keeper.py" in arg for arg in child.cmdline())]


async def test_a_grandchild_of_an_upstream_dies_with_a_sigkilled_llmswap(tmp_path: Path) -> None:
    model = demo_model("a")
    model["cmd"] = f"sh -c {shlex.quote(model['cmd'] + ' & wait')}"
    config = write_config(tmp_path / "config.yaml", {"a": model}, hooks={"on_startup": {"preload": ["a"]}})
    async with running_llmswap(config) as server:
        await server.wait_for_output("preload: a ready", within=WITHIN)
        grandchild = server.upstreams()["a"]
        shell = psutil.Process(grandchild).ppid()
        assert psutil.Process(shell).ppid() == server.pid  # llmswap -> sh -> demo
        server.process.kill()
        await server.wait_exit(WITHIN)

        async def grandchild_gone() -> bool:
            return not alive(grandchild)

        await eventually(grandchild_gone, within=WITHIN, what=f"grandchild {grandchild} gone")
        assert not alive(shell)


async def test_a_normal_unload_leaves_no_keeper_behind(tmp_path: Path) -> None:
    preload = {"on_startup": {"preload": ["a"]}}
    config = write_config(tmp_path / "config.yaml", {"a": demo_model("a")}, hooks=preload)
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        await server.wait_for_output("preload: a ready", within=WITHIN)
        assert len(keepers(server.pid)) == 1
        async with http.get(server.url + "/unload") as response:
            assert response.status == 200

        async def both_gone() -> bool:
            return not server.upstreams() and not keepers(server.pid)

        await eventually(both_gone, within=WITHIN, what="upstream and keeper gone")
