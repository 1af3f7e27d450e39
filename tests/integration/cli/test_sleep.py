"""Sleep instead of stop, with real processes: demo upstreams speaking vLLM's sleep API
(`--enable-sleep-mode`) behind a real llmswap, one model at a time. A model llmswap must make room for is
put to sleep (its process lives on, its pid unchanged) and woken, not started, when it is asked for again;
within `maxSleeping`; a server whose sleep fails is stopped and started cold later.

The demos take 1 s to start and 0.05 s to wake, so a wake and a start cannot be mistaken for each other.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.helpers.cli import WITHIN, LlmswapProcess, alive, demo_model, running_llmswap, write_config
from tests.helpers.wait import eventually

START = "1.0"
SLEEPY = ("--enable-sleep-mode", "--startup-delay", START, "--wake-delay", "0.05")
CALLS = {"sleep": "POST /sleep?level=1&mode=wait", "wake": "POST /wake_up"}


def sleepy(model_id: str, *flags: str, **settings: Any) -> dict[str, Any]:
    return demo_model(model_id, *flags, **{**CALLS, **settings})


async def chat(server: LlmswapProcess, model: str) -> float:
    """Seconds one chat with `model` took, its model's start or wake included."""
    began = time.monotonic()
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    async with aiohttp.ClientSession() as http, http.post(f"{server.url}/v1/chat/completions",
                                                           json=body) as response:
        assert response.status == 200, await response.text()
    return time.monotonic() - began


async def running(server: LlmswapProcess) -> dict[str, tuple[str, int]]:
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/running") as response:
        entries = (await response.json())["running"]
    return {entry["model"]: (entry["state"], entry["pid"]) for entry in entries}


def lines(server: LlmswapProcess, text: str) -> list[str]:
    return [line for line in server.stdout_lines + server.stderr_lines if text in line]


async def test_two_sleeping_models_start_once_each_and_wake_after(tmp_path: Path) -> None:
    models = {"a": sleepy("a", *SLEEPY), "b": sleepy("b", *SLEEPY)}
    async with running_llmswap(write_config(tmp_path / "config.yaml", models)) as server:
        first = await chat(server, "a")
        await chat(server, "b")
        pids = server.upstreams()
        asleep = await running(server)
        assert asleep == {"a": ("sleeping", pids["a"]), "b": ("ready", pids["b"])}
        snapshot = await first_event(server)
        assert {m["id"]: (m["state"], m["pid"]) for m in snapshot["models"]} == asleep
        listed = await llmswap_cli("ps", "--url", server.url)
        assert [line.split()[:2] for line in listed.splitlines()[1:]] == [["a", "sleeping"], ["b", "ready"]]
        third = await chat(server, "a")
        fourth = await chat(server, "b")
        assert server.upstreams() == pids  # the same two processes all along
        metrics = await _text(server, "/metrics")
    for model in ("a", "b"):
        assert len(lines(server, f"[{model}] starting:")) == 1, server.output()
        assert len(lines(server, f"[{model}] asleep in")) == 1 + (model == "a"), server.output()
        assert len(lines(server, f"[{model}] awake in")) == 1, server.output()
    assert third < first and fourth < first  # a wake, not a start (1 s), in the same run
    assert lines(server, "swap: b ready in") and "(evicted a (asleep)," in lines(server, "swap: b ready")[0]
    assert 'llmswap_model_sleep_duration_seconds_count{action="wake",model="a"} 1.0' in metrics
    # A wake is a phase of its own, in place of a start; the sleep that made room is the victim's stop.
    assert 'llmswap_swap_phase_seconds_count{model="a",phase="wake"} 1.0' in metrics
    woke = [line for line in lines(server, '"POST /v1/chat/completions" 200') if "model=a " in line][-1]
    assert " phases=stop:" in woke and ",wake:" in woke and "start:" not in woke


async def test_max_sleeping_zero_stops_instead(tmp_path: Path) -> None:
    models = {"a": sleepy("a", *SLEEPY), "b": sleepy("b", *SLEEPY)}
    config = write_config(tmp_path / "config.yaml", models, maxSleeping=0)
    async with running_llmswap(config) as server:
        await chat(server, "a")
        a_pid = server.upstreams()["a"]
        await chat(server, "b")
        assert not alive(a_pid)
        assert "a" not in await running(server)
        await chat(server, "a")
    assert len(lines(server, "[a] starting:")) == 2
    assert not lines(server, "asleep in")


async def test_beyond_max_sleeping_the_model_asleep_longest_is_stopped(tmp_path: Path) -> None:
    models = {name: sleepy(name, *SLEEPY) for name in ("a", "b", "c")}
    config = write_config(tmp_path / "config.yaml", models, maxSleeping=1)
    async with running_llmswap(config) as server:
        await chat(server, "a")
        await chat(server, "b")  # a asleep
        a_pid = server.upstreams()["a"]
        await chat(server, "c")  # b asleep too: one too many, a (asleep longest) is stopped
        assert not alive(a_pid)
        states = await running(server)
    assert {model: state for model, (state, _) in states.items()} == {"b": "sleeping", "c": "ready"}


async def test_a_server_that_cannot_sleep_is_stopped_and_started_cold_later(tmp_path: Path) -> None:
    # Configured to sleep, but the server has no sleep API (vLLM without VLLM_SERVER_DEV_MODE=1): 404.
    models = {"a": sleepy("a"), "b": sleepy("b")}
    async with running_llmswap(write_config(tmp_path / "config.yaml", models)) as server:
        await chat(server, "a")
        a_pid = server.upstreams()["a"]
        await chat(server, "b")
        assert not alive(a_pid)
        await chat(server, "a")
        assert server.upstreams()["a"] != a_pid
    [warning] = lines(server, "[a] sleep failed")
    assert "POST /sleep?level=1&mode=wait answered 404" in warning and "stopping it instead" in warning


async def test_sigkill_of_llmswap_leaves_no_sleeping_server_behind(tmp_path: Path) -> None:
    models = {"a": sleepy("a", *SLEEPY), "b": sleepy("b", *SLEEPY)}
    async with running_llmswap(write_config(tmp_path / "config.yaml", models)) as server:
        await chat(server, "a")
        await chat(server, "b")
        pids = server.upstreams()
        assert (await running(server))["a"][0] == "sleeping"
        server.process.kill()
        await server.wait_exit(WITHIN)

        async def gone() -> bool:
            return not any(alive(pid) for pid in pids.values())

        await eventually(gone, within=WITHIN, what="both upstreams gone, the sleeping one too")


async def first_event(server: LlmswapProcess) -> dict[str, Any]:
    """The snapshot `/api/events` opens with (the status page draws its models from it)."""
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/api/events") as response:
        async with asyncio.timeout(WITHIN):
            async for raw in response.content:
                line = raw.decode().strip()
                event = json.loads(line[5:]) if line.startswith("data:") else {}
                if event.get("type") == "snapshot":
                    data = event["data"]
                    return dict(json.loads(data) if isinstance(data, str) else data)
    raise AssertionError("no snapshot event")


async def llmswap_cli(*args: str) -> str:
    """What `llmswap ARGS` prints (an admin command against a running llmswap)."""
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "llmswap", *args,
                                                   stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(process.communicate(), WITHIN)
    assert process.returncode == 0, out
    return out.decode()


async def _text(server: LlmswapProcess, path: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}{path}") as response:
        return await response.text()


async def test_clients_cannot_put_a_model_to_sleep_through_upstream(tmp_path: Path) -> None:
    models = {"a": sleepy("a", *SLEEPY)}
    async with running_llmswap(write_config(tmp_path / "config.yaml", models)) as server:
        await chat(server, "a")
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{server.url}/upstream/a/sleep?level=1") as response:
                assert response.status == 403
                assert "llmswap's to call" in (await response.json())["error"]["message"]
            async with http.get(f"{server.url}/upstream/a/is_sleeping") as response:
                assert await response.json() == {"is_sleeping": False}  # reading the state is harmless
        assert (await running(server))["a"][0] == "ready"
