"""Run the real `llmswap` command for a benchmark: write its config, start it, wait until it and the models it
preloads answer, measure its memory, and stop it (and its upstreams) however the benchmark ends."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psutil

HOST = "127.0.0.1"
READY_WITHIN = 90.0  # llama.cpp's server imports FastAPI and loads a model on a busy 2-core machine
REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def write_config(path: Path, models: Mapping[str, Mapping[str, Any]], *, preload: Sequence[str]) -> Path:
    """A config of `models` (YAML names) that loads `preload` at startup; one model at a time."""
    path.write_text(json.dumps({  # JSON is YAML
        "healthCheckTimeout": int(READY_WITHIN),
        "models": {model_id: dict(entry) for model_id, entry in models.items()},
        "hooks": {"on_startup": {"preload": list(preload)}},
    }, indent=2))
    return path


@dataclass
class Llmswap:
    process: subprocess.Popen[bytes]
    url: str

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss(self) -> int:
        """llmswap's own resident memory in bytes (its upstreams not included)."""
        return int(psutil.Process(self.pid).memory_info().rss)

    def upstream_pids(self) -> list[int]:
        """llmswap's model servers (and what they started); not the keeper beside each one."""
        return [child.pid for child in psutil.Process(self.pid).children(recursive=True)
                if not _is_keeper(child)]

    def stop(self) -> None:
        """SIGTERM (llmswap stops its upstreams), then SIGKILL for the whole group if that takes too long."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@contextlib.asynccontextmanager
async def running_llmswap(config: Path, ready_urls: Sequence[str], args: Sequence[str] = ()
                          ) -> AsyncIterator[Llmswap]:
    """`llmswap --config CONFIG` on a free port (`args`: more of its command line), yielded once its /health
    and every one of `ready_urls` (the preloaded upstreams' own health URLs) answer 200. Its output goes to
    llmswap.log beside the config; if it does not become ready, the end of that log is in the error."""
    port = free_port()
    log_path = config.with_name("llmswap.log")
    with log_path.open("wb") as log:
        process = subprocess.Popen(  # noqa: ASYNC220 (started once, before anything is measured)
            [sys.executable, "-m", "llmswap", "--config", str(config), "--listen", f"{HOST}:{port}", *args],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
        )
    server = Llmswap(process, f"http://{HOST}:{port}")
    try:
        try:
            await wait_ready(server, [f"{server.url}/health", *ready_urls])
        except SystemExit as failed:
            tail = log_path.read_text(errors="replace").splitlines()[-30:]
            raise SystemExit(f"{failed}; the end of llmswap's output:\n" + "\n".join(tail)) from None
        yield server
    finally:
        server.stop()


async def wait_ready(server: Llmswap, urls: Sequence[str]) -> None:
    await wait_answering(server.process, urls, "llmswap")


async def wait_answering(process: subprocess.Popen[bytes], urls: Sequence[str], name: str,
                         within: float = READY_WITHIN) -> None:
    """Return once every one of `urls` answers 200; SystemExit when `process` exits first or time runs out."""
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as http:
        for url in urls:
            while True:
                if process.poll() is not None:
                    raise SystemExit(f"{name} exited with status {process.returncode} during startup")
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(url) as response:
                        if response.status == 200:
                            break
                if time.monotonic() > deadline:
                    raise SystemExit(f"{url} did not answer 200 within {within:g} s of {name}'s start")
                await asyncio.sleep(0.05)


class PeakRss:
    """Samples processes' resident memory while a block runs; keeps each one's peak."""

    def __init__(self, pids: Mapping[str, int], interval: float = 0.05) -> None:
        self.pids = dict(pids)
        self.interval = interval
        self.peaks = dict.fromkeys(pids, 0)
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        for name, pid in self.pids.items():
            with contextlib.suppress(psutil.NoSuchProcess):
                self.peaks[name] = max(self.peaks[name], int(psutil.Process(pid).memory_info().rss))

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval)

    async def __aenter__(self) -> PeakRss:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.sample()


def _is_keeper(process: psutil.Process) -> bool:
    """Whether `process` is the keeper llmswap runs beside a model server (llmswap/process/keeper.py)."""
    try:
        return any(part.endswith("keeper.py") for part in process.cmdline())
    except psutil.Error:
        return False


def find_llama_swap() -> str | None:
    """llama-swap's binary for the benches that run it beside llmswap: the one built from its source beside
    the repository (`../shared/bin/llama-swap`), else one on PATH."""
    beside = REPO.parent / "shared" / "bin" / "llama-swap"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("llama-swap")


@contextlib.asynccontextmanager
async def running_process(argv: Sequence[str], ready_urls: Sequence[str], log: Path, *, within: float = 120.0,
                          cwd: Path = REPO, env: Mapping[str, str] | None = None,
                          ) -> AsyncIterator[subprocess.Popen[bytes]]:
    """A server a benchmark sets beside llmswap (llama-swap, llama.cpp's router, a bare proxy, another
    build of llmswap), its output in `log`, yielded once every one of `ready_urls` answers 200; stopped with
    whatever it started when the block ends. `cwd` and `env`: where and with what environment it runs."""
    with log.open("wb") as out:
        process = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out,  # noqa: ASYNC220
                                   stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd,
                                   env=None if env is None else dict(env))
    try:
        await wait_answering(process, ready_urls, f"{Path(argv[0]).name} (its output: {log})", within=within)
        yield process
    finally:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(process.pid).children(recursive=True):
                child.terminate()
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
