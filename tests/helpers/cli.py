"""Run the `llmswap` command as a real child process in tests, over config files of demo upstreams.

``running_llmswap(config_path, ...)`` starts `python -m llmswap --config ... --listen 127.0.0.1:PORT`, waits
until /health answers, and on the way out kills it and every upstream it started (they live in sessions
of their own, so killing llmswap's process group alone would not reach them). ``demo_model`` and
``write_config`` write the YAML a user would.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import resource
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import psutil
import yaml

from tests.helpers.demo import HOST, DemoProcess, free_port

WITHIN = 20.0  # generous: llmswap and its upstreams start on a busy 2-core machine


def demo_model(model_id: str, *flags: str, port: int | None = None, **settings: Any) -> dict[str, Any]:
    """A `models.<id>` entry served by the demo upstream on a fixed free port (stable across rewrites)."""
    port = free_port() if port is None else port
    argv = [sys.executable, "-m", "llmswap.demo", "--port", str(port), "--model-name", model_id, *flags]
    cmd = " ".join(argv)
    return {"cmd": cmd, "proxy": f"http://{HOST}:{port}", "unloadTimeout": 2, **settings}


def write_config(path: Path, models: Mapping[str, Mapping[str, Any]], **top: Any) -> Path:
    """Write a config file with these models and top-level keys (YAML names, e.g. logLevel=...)."""
    document: dict[str, Any] = {"healthCheckTimeout": 15, **top}
    document["models"] = {model_id: dict(entry) for model_id, entry in models.items()}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def together(*models: str) -> dict[str, Any]:
    """A `routing:` section where these models run side by side (no swapping between them)."""
    group = {"swap": False, "exclusive": True, "members": list(models)}
    return {"router": {"use": "group", "settings": {"groups": {"together": group}}}}


class LlmswapProcess(DemoProcess):
    """A running `llmswap`: its URL, its output so far, its upstreams."""

    def __init__(self, process: asyncio.subprocess.Process, port: int) -> None:
        super().__init__(process, "llmswap")
        self.port = port

    def upstreams(self) -> dict[str, int]:
        """Model name → PID of every live demo upstream this llmswap started."""
        return self.children_running("llmswap.demo", "--model-name")

    def children_running(self, module: str, name_flag: str) -> dict[str, int]:
        """Name → PID of every live descendant started as `python -m <module> ... <name_flag> <name>`."""
        found: dict[str, int] = {}
        with contextlib.suppress(psutil.NoSuchProcess):
            for child in psutil.Process(self.pid).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
                    if child.status() == psutil.STATUS_ZOMBIE:
                        continue
                    argv = child.cmdline()
                    if module in argv and name_flag in argv:
                        found[argv[argv.index(name_flag) + 1]] = child.pid
        return found

    async def kill(self) -> None:
        try:
            stragglers = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            stragglers = []
        await super().kill()
        for child in stragglers:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie waiting to be reaped counts as dead)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextlib.asynccontextmanager
async def running_llmswap(
    config: Path | None,
    *args: str,
    port: int | None = None,
    healthy: bool = True,
    within: float = WITHIN,
    open_files: tuple[int, int] | None = None,
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[LlmswapProcess]:
    """Start llmswap on `config` (extra CLI `args`), wait for /health unless `healthy` is False, and kill
    it and its upstreams when the block ends, whatever happened. With `config` None, `args` are the whole
    command line and must listen on `port`. `open_files`: the (soft, hard) RLIMIT_NOFILE llmswap starts
    with (a hard limit of -1 keeps the current one). `env`: variables set for it, beside the test's own."""
    port = free_port() if port is None else port
    where = () if config is None else ("--config", str(config), "--listen", f"{HOST}:{port}")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmswap", *where, *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        preexec_fn=None if open_files is None else functools.partial(_limit_open_files, *open_files),
    )
    server = LlmswapProcess(process, port)
    try:
        if healthy:
            await server.wait_healthy(within)
        yield server
    finally:
        await server.kill()


def _limit_open_files(soft: int, hard: int) -> None:  # runs in the child, before exec
    current_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, current_hard if hard < 0 else hard))


async def stop_with(server: LlmswapProcess, signum: int = signal.SIGTERM, within: float = WITHIN) -> int:
    """Send `signum` and return the exit status."""
    server.send_signal(signum)
    return await server.wait_exit(within)
