"""Run the demo upstream (``python -m llmswap.demo``) as a real child process in tests.

``running_demo(...)`` starts one, waits until it listens (and, by default, until /health answers 200), and
always kills its whole process group on the way out. ``free_port()`` finds a port for code that must know the
address before the process starts (e.g. a ModelConfig's ``proxy``).
"""

import asyncio
import contextlib
import os
import random
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Literal

import aiohttp

HOST = "127.0.0.1"
_LISTENING = re.compile(r"^llmswap-demo: listening on http://(?:\[[^\]]+\]|[^:/]+):(\d+) ")


# Ports handed out by free_port and free_port_run in this test run, never handed out again.
_HANDED_OUT: set[int] = set()
_PICKER = random.SystemRandom()
# Below the kernel's ephemeral range (32768 and up on Linux), where every listener bound to port 0 (an
# in-process server, a demo on --port 0) and every outgoing connection takes its port: so none of those
# can take a port handed out here before its user binds it, as happened when free_port asked for port 0.
_RANGE = (20000, 32000)


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on right now, picked where nothing else picks (see `_RANGE`) and not
    handed out before in this run."""
    return free_port_run(1, host)


def free_port_run(count: int, host: str = HOST) -> int:
    """The first of `count` consecutive free ports (for llmswap's `${PORT}`, which counts up from
    `startPort`), as `free_port` picks them."""
    for _ in range(500):
        first = _PICKER.randrange(_RANGE[0], _RANGE[1] - count)
        run = range(first, first + count)
        if not _HANDED_OUT.intersection(run) and all(port_is_free(port, host) for port in run):
            _HANDED_OUT.update(run)
            return first
    raise RuntimeError(f"no {count} consecutive free ports found in {_RANGE[0]}-{_RANGE[1]}")


def port_is_free(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def demo_command(model_name: str, port: int, *flags: str) -> list[str]:
    """The command line that starts a demo, e.g. for a ModelConfig's cmd."""
    return [sys.executable, "-m", "llmswap.demo", "--port", str(port), "--model-name", model_name, *flags]


class DemoProcess:
    """A demo child process: its address, everything it printed so far, and ways to wait on it."""

    def __init__(self, process: asyncio.subprocess.Process, model_name: str) -> None:
        self.process = process
        self.model_name = model_name
        self.port: int | None = None
        self.stdout_lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._output_changed = asyncio.Condition()
        self._open_streams = 2
        assert process.stdout is not None and process.stderr is not None
        self._readers = [
            asyncio.create_task(self._read(process.stdout, self.stdout_lines)),
            asyncio.create_task(self._read(process.stderr, self.stderr_lines)),
        ]

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        assert self.port is not None, "the demo has not said which port it listens on yet"
        return f"http://{HOST}:{self.port}"

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def output(self) -> str:
        """Everything printed so far, for assertion messages."""
        return "stdout:\n" + "\n".join(self.stdout_lines) + "\nstderr:\n" + "\n".join(self.stderr_lines)

    async def _read(self, stream: asyncio.StreamReader, lines: list[str]) -> None:
        try:
            while raw := await stream.readline():
                async with self._output_changed:
                    lines.append(raw.decode(errors="replace").rstrip("\n"))
                    self._output_changed.notify_all()
        finally:
            async with self._output_changed:
                self._open_streams -= 1
                self._output_changed.notify_all()

    async def wait_for_output(self, text: str, *, stderr: bool = False, within: float = 15.0) -> str:
        """The first line containing ``text``; fails if the demo closes its output without printing it."""
        lines = self.stderr_lines if stderr else self.stdout_lines

        def found_or_closed() -> bool:
            return any(text in line for line in lines) or self._open_streams == 0

        async with self._output_changed:
            try:
                await asyncio.wait_for(self._output_changed.wait_for(found_or_closed), within)
            except TimeoutError:
                raise AssertionError(
                    f"the demo did not print {text!r} within {within} s\n{self.output()}"
                ) from None
        for line in lines:
            if text in line:
                return line
        raise AssertionError(f"the demo closed its output without printing {text!r}\n{self.output()}")

    async def wait_listening(self, within: float = 15.0) -> int:
        line = await self.wait_for_output("llmswap-demo: listening on", within=within)
        match = _LISTENING.match(line)
        assert match, f"unexpected listening line {line!r}"
        self.port = int(match.group(1))
        return self.port

    async def wait_healthy(self, within: float = 15.0, interval: float = 0.02) -> None:
        """Poll /health until it answers 200; fail at once if the demo exits first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        async with aiohttp.ClientSession() as session:
            while True:
                if self.returncode is not None:
                    raise AssertionError(
                        f"the demo exited with {self.returncode} before it was healthy\n{self.output()}"
                    )
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"{self.url}/health") as response:
                        if response.status == 200:
                            return
                if loop.time() > deadline:
                    raise AssertionError(f"the demo was not healthy within {within} s\n{self.output()}")
                await asyncio.sleep(interval)

    async def wait_exit(self, within: float = 15.0) -> int:
        try:
            return await asyncio.wait_for(self.process.wait(), within)
        except TimeoutError:
            raise AssertionError(f"the demo did not exit within {within} s\n{self.output()}") from None

    def send_signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    async def kill(self) -> None:
        """SIGKILL the demo's whole process group (grandchildren too) and collect its output."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        await self.process.wait()
        # The output ends once every process holding the pipes is gone; a reader still blocked after
        # that would only keep the test waiting, so it is cancelled.
        _, pending = await asyncio.wait(self._readers, timeout=5.0)
        for reader in pending:
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)


@contextlib.asynccontextmanager
async def running_demo(
    model_name: str = "demo",
    flags: Sequence[str] = (),
    *,
    port: int = 0,
    wait_until: Literal["healthy", "listening", "started"] = "healthy",
    within: float = 15.0,
) -> AsyncIterator[DemoProcess]:
    """Start a demo (port 0 lets it pick a free one) and wait until it is healthy, or only until it listens,
    or not at all ("started", for demos expected to fail at start). Its whole process group is killed when
    the block ends, whatever happened."""
    process = await asyncio.create_subprocess_exec(
        *demo_command(model_name, port, *flags),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # its own process group, so cleanup reaches grandchildren
    )
    demo = DemoProcess(process, model_name)
    try:
        if wait_until != "started":
            await demo.wait_listening(within)
        if wait_until == "healthy":
            await demo.wait_healthy(within)
        yield demo
    finally:
        await demo.kill()
