"""Starts that fail: premature exit, health-check timeout, spawn error, port already taken."""

from __future__ import annotations

import asyncio
import os
import socket
import sys

import pytest

from llmswap.process import ProcessState, StartFailed
from tests.helpers.demo import free_port
from tests.helpers.models import demo_config
from tests.integration.process.conftest import MakeProcess, spawned_pid, wait_gone


async def test_premature_exit_fails_the_start_with_the_exit_code_and_last_output(
    make_process: MakeProcess,
) -> None:
    # A long health-check timeout: only noticing the exit itself can end this start early.
    process, events = make_process(demo_config("crashy", "--never-healthy", "--exit-after", "0.5"))

    with pytest.raises(StartFailed) as failure:
        await process.ensure_ready()

    event = await events.wait_for("start_failed")
    assert event.exit_code == 3
    assert failure.value.message.startswith("upstream command exited prematurely (exit code 3)")
    assert "--exit-after 0.5 s has passed" in failure.value.message  # the demo's last words
    assert event.detail == failure.value.message
    assert process.state is ProcessState.STOPPED
    assert events.kinds() == ["starting", "start_failed"]


async def test_a_failed_start_can_be_retried(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config("again", "--never-healthy", "--exit-after", "0.2"))
    for _ in range(2):
        with pytest.raises(StartFailed, match="exited prematurely"):
            await process.ensure_ready()
    assert events.kinds() == ["starting", "start_failed", "starting", "start_failed"]


async def test_health_check_timeout_kills_the_child(make_process: MakeProcess) -> None:
    process, events = make_process(demo_config("stuck", "--never-healthy", health_check_timeout=1.5))
    start = asyncio.create_task(process.ensure_ready())
    pid = await spawned_pid(process)

    with pytest.raises(StartFailed) as failure:
        await start

    assert failure.value.message.startswith("health check timed out after 1.5s")
    assert "/health never answered 200" in failure.value.message
    event = await events.wait_for("start_failed")
    assert process.state is ProcessState.STOPPED
    assert event.exit_code is not None
    await wait_gone(pid)


async def test_a_command_that_cannot_be_spawned_fails_clearly(make_process: MakeProcess) -> None:
    port = free_port()
    config = demo_config("missing", port=port, cmd=("/nonexistent/llama-server", "--port", str(port)))
    process, events = make_process(config)

    with pytest.raises(StartFailed, match=r"failed to start command '/nonexistent/llama-server --port \d+': "
                                          r"/nonexistent/llama-server does not exist; fix the path in cmd"):
        await process.ensure_ready()
    assert events.kinds() == ["starting", "start_failed"]
    assert process.state is ProcessState.STOPPED


async def test_a_program_that_is_not_on_path_is_named_with_the_path_it_was_looked_up_in(
        make_process: MakeProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    port = free_port()
    config = demo_config("missing", port=port, cmd=("llama-server-not-here", "--port", str(port)))
    process, _ = make_process(config)
    with pytest.raises(StartFailed, match=r"'llama-server-not-here' is not on PATH \(/usr/bin:/bin\); give "
                                          r"its full path in cmd, or add its folder to PATH"):
        await process.ensure_ready()


async def test_a_taken_port_fails_before_spawning_and_names_the_holder(make_process: MakeProcess) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        process, events = make_process(demo_config("blocked", port=port))

        with pytest.raises(StartFailed) as failure:
            await process.ensure_ready()

    message = failure.value.message
    assert f"port {port}" in message and "blocked" in message
    assert f"pid {os.getpid()}" in message  # psutil can see our own socket
    assert "give models.blocked a free port" in message
    assert process.pid is None and process.logs.history() == []  # nothing was spawned
    assert events.kinds() == ["starting", "start_failed"]


async def test_empty_command_names_the_key_to_fix(make_process: MakeProcess) -> None:
    process, _ = make_process(demo_config("empty", cmd=()))
    with pytest.raises(StartFailed, match=r"models\.empty\.cmd is empty"):
        await process.ensure_ready()


async def test_env_entries_reach_the_child(make_process: MakeProcess) -> None:
    script = "import os; print('VALUE=' + os.environ['LLMSWAP_TEST_VALUE'], flush=True); raise SystemExit(5)"
    config = demo_config("env", cmd=(sys.executable, "-c", script), env=(("LLMSWAP_TEST_VALUE", "x y"),))
    process, _ = make_process(config)
    with pytest.raises(StartFailed, match=r"exit code 5\); last output:\n  VALUE=x y"):
        await process.ensure_ready()


async def test_a_server_without_the_health_endpoint_fails_its_start_saying_so(
    make_process: MakeProcess,
) -> None:
    # The demo answers 404 at any path it does not serve: the start ends once that has gone on for a few
    # seconds, long before healthCheckTimeout, with what to change.
    config = demo_config("nohealth", check_endpoint="/no-such-health", health_check_timeout=30)
    process, events = make_process(config)
    with pytest.raises(StartFailed) as failure:
        await process.ensure_ready()
    message = failure.value.message
    assert message.startswith(f"health check failed: {config.proxy}/no-such-health answered 404 for 3s")
    assert "set the model's checkEndpoint to a path it answers 200 on, such as /v1/models" in message
    assert process.state is ProcessState.STOPPED
    assert events.kinds() == ["starting", "start_failed"]
