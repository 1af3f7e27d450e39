"""Stopping an upstream: SIGTERM then SIGKILL after the grace, cmdStop with ${PID}, nothing left behind."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from llmswap.process import ProcessState
from tests.helpers.models import demo_config
from tests.integration.process.conftest import MakeProcess, is_gone, wait_for_line, wait_gone


async def test_graceful_stop_uses_sigterm(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config("polite"))
    await process.ensure_ready()
    pid = process.pid

    await process.stop()

    stopped = events.of("stopped")[0]
    assert stopped.exit_code == 0  # the demo exits cleanly on SIGTERM
    assert stopped.detail == "stop requested"
    assert process.state is ProcessState.STOPPED and process.pid is None
    assert pid is not None and is_gone(pid)


async def test_a_child_ignoring_sigterm_is_killed_after_the_grace(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config("stubborn", "--ignore-sigterm", unload_timeout=0.3))
    await process.ensure_ready()
    pid = process.pid

    await process.stop()

    assert events.of("stopped")[0].exit_code == -signal.SIGKILL
    assert process.state is ProcessState.STOPPED
    assert pid is not None and is_gone(pid)


async def test_stop_timeout_overrides_the_model_grace(make_process: MakeProcess) -> None:
    # unloadTimeout is far longer than the test's bound: only the explicit 0.2 s can let it finish in time.
    process, events = make_process(demo_config("override", "--ignore-sigterm", unload_timeout=3600))
    await process.ensure_ready()
    await process.stop(timeout=0.2)
    assert events.of("stopped")[0].exit_code == -signal.SIGKILL


async def test_cmd_stop_runs_with_the_upstream_pid(make_process: MakeProcess, tmp_path: Path) -> None:
    record = tmp_path / "cmd_stop_argv"
    stopper = (
        "import os, signal, sys\n"
        "open(sys.argv[1], 'w').write(sys.argv[2])\n"
        "print('stopper: stopping', sys.argv[2], flush=True)\n"
        "os.kill(int(sys.argv[2]), signal.SIGTERM)\n"
    )
    cmd_stop = (sys.executable, "-c", stopper, str(record), "${PID}")
    process, events = make_process(demo_config("custom", cmd_stop=cmd_stop))
    await process.ensure_ready()
    pid = process.pid

    await process.stop()

    assert record.read_text() == str(pid)
    assert events.of("stopped")[0].exit_code == 0  # cmdStop's SIGTERM, not our SIGKILL, ended it
    assert f"stopper: stopping {pid}" in process.logs.history()


async def test_a_cmd_stop_that_cannot_run_falls_back_to_sigterm(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config("fallback", cmd_stop=("/nonexistent/stopper", "${PID}")))
    await process.ensure_ready()
    await process.stop()
    assert events.of("stopped")[0].exit_code == 0


async def test_a_forked_grandchild_dies_with_the_upstream(make_process: MakeProcess) -> None:
    process, _ = make_process(demo_config("forking", "--spawn-grandchild"))
    await process.ensure_ready()
    line = await wait_for_line(process.logs, "grandchild pid=")
    grandchild = int(line.rsplit("=", 1)[1])
    assert not is_gone(grandchild)

    await process.stop()

    await wait_gone(grandchild)
