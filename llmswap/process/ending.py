"""How a child's life ends once a stop is decided: cmdStop or SIGTERM to its group, the grace, SIGKILL to its
group, then its output drained. Run on the process's supervisor task (`Process._stop`, `_exited`...)."""

from __future__ import annotations

import logging
import signal
import subprocess
from collections.abc import Callable, Mapping

from llmswap.config.model import ModelConfig
from llmswap.process.child import Child, spawn_child
from llmswap.process.durations import format_go_duration
from llmswap.process.run import Run

logger = logging.getLogger("llmswap.process")

KILL_WAIT = 10.0  # seconds to wait for a SIGKILLed child to be reaped before reporting it stuck
DRAIN_TIMEOUT = 1.0  # seconds to keep reading output once the child is gone


async def terminate(run: Run, child: Child, config: ModelConfig, *, clock: Callable[[], float],
                    env: Mapping[str, str], on_line: Callable[[str], None]) -> None:
    """cmdStop or SIGTERM to the group, `run.grace` seconds, SIGKILL to the group; then drain the pipe."""
    stopper: Child | None = None
    began = clock()
    if not child.exited.done():
        if config.cmd_stop:
            stopper = await start_cmd_stop(config, child.pid, env=env, on_line=on_line)
        if stopper is None:
            child.signal_group(signal.SIGTERM)
        while not child.exited.done():
            remaining = began + run.grace - clock()
            if remaining <= 0:
                break
            await run.pause(remaining, child.exited)
        if not child.exited.done():
            logger.warning("[%s] pid %d still running %s after the stop signal: SIGKILL to its process group",
                           config.id, child.pid, format_go_duration(run.grace))
            child.signal_group(signal.SIGKILL)
            if not await child.wait_exit(KILL_WAIT):
                logger.error("[%s] pid %d survived SIGKILL for %ss", config.id, child.pid, KILL_WAIT)
    # Whatever the upstream forked into its group and left behind goes with it.
    child.signal_group(signal.SIGKILL)
    if stopper is not None:
        await stopper.wait_exit(max(0.0, began + run.grace - clock()))
        stopper.signal_group(signal.SIGKILL)
        await stopper.close(DRAIN_TIMEOUT)
    await child.close(DRAIN_TIMEOUT)


async def start_cmd_stop(config: ModelConfig, pid: int, *, env: Mapping[str, str],
                         on_line: Callable[[str], None]) -> Child | None:
    argv = [part.replace("${PID}", str(pid)) for part in config.cmd_stop]
    logger.info("[%s] stopping with: %s", config.id, config.cmd_stop_shown(pid))
    try:
        return await spawn_child(argv, env=dict(env), on_line=on_line)
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("[%s] cmdStop '%s' failed to start (%s): sending SIGTERM", config.id, argv[0], exc)
        return None
