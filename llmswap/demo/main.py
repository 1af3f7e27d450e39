"""The demo's life: start-up checks, serving, the timed health flip and crash, signals, exit codes.

Exit codes: 0 after SIGTERM or SIGINT; 1 when it cannot start (fake out-of-memory, port taken, claim file
not writable); 2 for bad flags; 3 when --exit-after fires.
"""

import asyncio
import atexit
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from aiohttp import web

from llmswap.demo.app import build_app
from llmswap.demo.console import PREFIX, complain, say
from llmswap.demo.context import Demo
from llmswap.demo.fake_gpu import out_of_memory, remove_claim, write_claim
from llmswap.demo.options import DemoOptions, parse_options
from llmswap.demo.sleep_api import Sleep
from llmswap.demo.slots_api import read_whole

EXIT_OK = 0
EXIT_CANNOT_START = 1
EXIT_CRASH = 3
# In-flight answers get this long to finish after SIGTERM before they are cut.
SHUTDOWN_GRACE = 1.0

# Held so the Popen objects are not collected (and warned about) while their processes still run.
_grandchildren: list[subprocess.Popen[bytes]] = []


def main(argv: Sequence[str] | None = None, *, started_at: float | None = None) -> int:
    """Run the demo until a signal or a knob ends it; return the exit code."""
    started_at = time.monotonic() if started_at is None else started_at
    options = parse_options(argv)
    # Set before anything slow, so that a signal during start-up already gets the behaviour asked for.
    signal.signal(signal.SIGTERM, signal.SIG_IGN if options.ignore_sigterm else _exit_quietly)
    if options.fake_gpu_dir is not None:
        try:
            options.fake_gpu_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            complain(f"{PREFIX}cannot create --fake-gpu-dir {options.fake_gpu_dir}: {exc.strerror or exc}")
            return EXIT_CANNOT_START
        if options.fake_gpu_total is not None:
            problem = out_of_memory(
                options.fake_gpu_dir, os.getpid(), options.fake_vram or 0, options.fake_gpu_total
            )
            if problem is not None:
                complain(problem)
                return EXIT_CANNOT_START
    if options.spawn_grandchild:
        _spawn_grandchild()
    return asyncio.run(_serve(options, started_at))


def _exit_quietly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(EXIT_OK)


def _spawn_grandchild() -> None:
    # Same process group and no inherited pipes: it outlives the demo unless someone kills the whole group,
    # which is what process-group tests want to see, and it never holds the demo's log pipes open.
    child = subprocess.Popen(
        ["sleep", "1000"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _grandchildren.append(child)
    say(f"grandchild pid={child.pid}")


async def _serve(options: DemoOptions, started_at: float) -> int:
    loop = asyncio.get_running_loop()
    demo = Demo(options)
    claim: Path | None = None

    def asleep(sleeping: bool) -> None:
        """vLLM frees its GPU memory while asleep but a CUDA context (`--sleep-residue`): so does the fake."""
        nonlocal claim
        if options.fake_gpu_dir is None or options.fake_vram is None:
            return
        if claim is not None:
            remove_claim(claim)
            claim = None
        size = options.sleep_residue if sleeping else options.fake_vram
        if size:
            claim = write_claim(options.fake_gpu_dir, os.getpid(), size)

    if options.sleep_mode:
        demo.sleep = Sleep(options.sleep_delay, options.wake_delay, on_change=asleep)
    runner = web.AppRunner(
        build_app(demo),
        handle_signals=False,
        access_log=None,
        shutdown_timeout=SHUTDOWN_GRACE,
        # A client that hangs up cancels its answer, as llama-server stops generating for nobody.
        handler_cancellation=True,
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, options.host, options.port).start()
    except OSError as exc:
        await runner.cleanup()
        complain(
            f"{PREFIX}cannot listen on {options.host}:{options.port}: {exc.strerror or exc}; "
            "choose another --port (0 picks a free one)"
        )
        return EXIT_CANNOT_START
    host, port = runner.addresses[0][:2]
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    say(f"listening on http://{address} as model {options.model_name} (pid {os.getpid()})")

    stopping = asyncio.Event()
    exit_code = EXIT_OK
    loop.add_signal_handler(signal.SIGINT, stopping.set)
    if not options.ignore_sigterm:
        loop.add_signal_handler(signal.SIGTERM, stopping.set)

    def become_healthy() -> None:
        nonlocal claim, exit_code
        if options.fake_gpu_dir is not None and options.fake_vram is not None:
            try:
                claim = write_claim(options.fake_gpu_dir, os.getpid(), options.fake_vram)
            except OSError as exc:
                complain(
                    f"{PREFIX}cannot write the fake GPU claim in {options.fake_gpu_dir}: {exc}; "
                    "make --fake-gpu-dir a writable directory"
                )
                exit_code = EXIT_CANNOT_START
                stopping.set()
                return
            atexit.register(remove_claim, claim)
        demo.state.healthy = True

    def crash() -> None:
        if claim is not None:
            remove_claim(claim)  # a crashed CUDA process frees its memory too
        complain(f"{PREFIX}exiting with code {EXIT_CRASH}: --exit-after {options.exit_after:g} s has passed")
        os._exit(EXIT_CRASH)

    def after(seconds: float, callback: Callable[[], None]) -> None:
        loop.call_later(max(0.0, started_at + seconds - time.monotonic()), callback)

    def healthy_when_file() -> None:
        gate = options.healthy_when
        if gate is None or gate.exists():
            become_healthy()
        else:
            loop.call_later(0.02, healthy_when_file)

    if not options.never_healthy and options.weights is not None:
        weights = options.weights

        def loaded(_: object) -> None:
            after(options.startup_delay, healthy_when_file)

        loop.run_in_executor(None, read_whole, weights).add_done_callback(loaded)
    elif not options.never_healthy:
        after(options.startup_delay, healthy_when_file)
    if options.exit_after is not None:
        after(options.exit_after, crash)
    try:
        await stopping.wait()
    finally:
        await runner.cleanup()
        if claim is not None:
            remove_claim(claim)
    return exit_code

