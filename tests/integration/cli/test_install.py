"""An install by name: the package built and installed into a fresh venv serves examples/demo.yaml with a PATH
that holds neither the venv nor the project (the demo's upstream runs as `${PYTHON} -m llmswap.demo`).

This builds the package and fetches its dependencies from the package registry, so it takes about a
minute; `-m "not install"` leaves it out.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.helpers.cli import WITHIN, LlmswapProcess, alive
from tests.helpers.demo import HOST, free_port

PROJECT = Path(__file__).resolve().parents[3]
NOT_PACKAGED = shutil.ignore_patterns(".*", "__pycache__", "*.egg-info", "build", "dist", "tests", "bench",
                                      "docs")
BARE_PATH = os.pathsep.join(("/usr/bin", "/bin"))

pytestmark = [pytest.mark.install, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(the venv's bin directory, a copy of the project): `pip install` of a clean copy into a fresh venv."""
    root = tmp_path_factory.mktemp("install")
    source = root / "llmswap-src"
    shutil.copytree(PROJECT, source, ignore=NOT_PACKAGED)  # a clean tree: no build output left in ours
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(source)],
                          capture_output=True, text=True, timeout=840, check=False)
    assert done.returncode == 0, f"pip install failed:\n{done.stdout}\n{done.stderr}"
    yield venv / "bin", source


def test_the_installed_command_runs_from_its_own_path(installed: tuple[Path, Path]) -> None:
    bin_dir, _ = installed
    done = subprocess.run([str(bin_dir / "llmswap"), "-version"], capture_output=True, text=True,
                          env={"PATH": BARE_PATH}, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("llmswap ")


async def test_the_demo_config_is_served_with_no_path_set_up(installed: tuple[Path, Path],
                                                              tmp_path: Path) -> None:
    bin_dir, source = installed
    port = free_port()
    env = {"PATH": BARE_PATH, "HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    process = await asyncio.create_subprocess_exec(
        str(bin_dir / "llmswap"), "--config", str(source / "examples" / "demo.yaml"),
        "--listen", f"{HOST}:{port}",
        cwd=tmp_path, env=env, start_new_session=True,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    server = LlmswapProcess(process, port)
    try:
        await server.wait_healthy(WITHIN)
        request = {"model": "small", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{server.url}/v1/chat/completions", json=request) as response,
        ):
            assert response.status == 200, await response.text()
            body = await response.json()
        assert "demo small says" in body["choices"][0]["message"]["content"]
        upstream = server.upstreams()["small"]
        server.send_signal(signal.SIGTERM)
        assert await server.wait_exit(WITHIN) == 0
        assert not alive(upstream)
    finally:
        await server.kill()
