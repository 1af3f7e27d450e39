"""Config reload of a running `llmswap` (SIGHUP and --watch-config): unchanged models keep their process."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import aiohttp

from tests.helpers.cli import (
    WITHIN,
    LlmswapProcess,
    alive,
    demo_model,
    running_llmswap,
    together,
    write_config,
)
from tests.helpers.sse import parse_events
from tests.helpers.wait import eventually


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}], **extra}


async def ask(http: aiohttp.ClientSession, server: LlmswapProcess, model: str) -> None:
    async with http.post(f"{server.url}/v1/chat/completions", json=chat(model)) as response:
        assert response.status == 200, await response.text()
        assert (await response.json())["model"] == model


async def listed(http: aiohttp.ClientSession, server: LlmswapProcess) -> list[str]:
    async with http.get(f"{server.url}/v1/models") as response:
        assert response.status == 200
        return sorted(m["id"] for m in (await response.json())["data"])


def count(server: LlmswapProcess, text: str) -> int:
    return sum(text in line for line in server.stdout_lines)


async def test_sighup_keeps_the_unchanged_model_and_restarts_the_changed_one(tmp_path: Path) -> None:
    models = {"a": demo_model("a"), "b": demo_model("b")}
    preload = {"on_startup": {"preload": ["a", "b"]}}
    config = write_config(tmp_path / "config.yaml", models, routing=together("a", "b"), hooks=preload)
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        await server.wait_for_output("preload: b ready", within=WITHIN)
        before = server.upstreams()
        assert set(before) == {"a", "b"}

        models["b"] = {**models["b"], "cmd": models["b"]["cmd"] + " --tokens-per-second 500"}
        write_config(config, models, routing=together("a", "b"), hooks=preload)
        server.send_signal(signal.SIGHUP)
        await server.wait_for_output("config reload: applied")

        # The changed model's old process goes; it is preloaded again (it is in `preload`), a is not.
        await eventually(lambda: _async(not alive(before["b"])), within=WITHIN, what="the old b to stop")
        await eventually(lambda: _async(count(server, "preload: b ready") == 2), within=WITHIN,
                         what="b to be preloaded again")
        assert count(server, "preload: a ready") == 1
        await ask(http, server, "a")
        await ask(http, server, "b")
        after = server.upstreams()
        assert after["a"] == before["a"]
        assert after["b"] != before["b"]
        await server.wait_for_output("has finished its last request")


async def test_a_stream_on_an_unchanged_model_runs_through_a_reload(tmp_path: Path) -> None:
    models = {"a": demo_model("a", "--tokens-per-second", "40"), "b": demo_model("b")}
    config = write_config(tmp_path / "config.yaml", models, routing=together("a", "b"))
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        await ask(http, server, "b")
        request = chat("a", stream=True, max_tokens=30)
        async with http.post(f"{server.url}/v1/chat/completions", json=request) as response:
            first = await response.content.readline()
            pid = server.upstreams()["a"]
            del models["b"]
            write_config(config, models)
            server.send_signal(signal.SIGHUP)
            await server.wait_for_output("config reload: applied")
            body = first + await response.read()
        events = parse_events(body.decode())
        assert events[-1].data == "[DONE]"
        assert events[-2].json()["choices"][0]["finish_reason"] == "length"
        await eventually(lambda: _async(server.upstreams() == {"a": pid}), within=WITHIN,
                         what="the removed model to stop while a keeps running")
        assert await listed(http, server) == ["a"]
        await ask(http, server, "a")
        assert server.upstreams() == {"a": pid}


async def test_a_broken_config_on_reload_keeps_the_running_one(tmp_path: Path) -> None:
    models = {"a": demo_model("a")}
    config = write_config(tmp_path / "config.yaml", models)
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        await ask(http, server, "a")
        pid = server.upstreams()["a"]
        good = config.read_text()
        config.write_text(good + "  c:\n    cmd: demo\n    ttl: -5\n")
        server.send_signal(signal.SIGHUP)
        line = await server.wait_for_output("does not load, the running config stays in use")
        assert str(config) in line
        await server.wait_for_output(f"{config}:")  # the problem itself, with its file:line
        assert await listed(http, server) == ["a"]
        await ask(http, server, "a")
        assert server.upstreams() == {"a": pid}

        models["c"] = demo_model("c")
        write_config(config, models)
        server.send_signal(signal.SIGHUP)
        await server.wait_for_output("config reload: applied")
        assert await listed(http, server) == ["a", "c"]
        assert server.upstreams() == {"a": pid}


async def test_watch_config_applies_an_edited_file(tmp_path: Path) -> None:
    models = {"a": demo_model("a"), "b": demo_model("b")}
    config = write_config(tmp_path / "config.yaml", models, routing=together("a", "b"))
    async with running_llmswap(config, "--watch-config") as server, aiohttp.ClientSession() as http:
        await ask(http, server, "a")
        pid = server.upstreams()["a"]
        models["c"] = demo_model("c")
        write_config(config, models, routing=together("a", "b", "c"))

        async def has_c() -> bool:
            return "c" in await listed(http, server)

        await eventually(has_c, within=WITHIN, what="the edited config to be applied")
        await ask(http, server, "c")
        assert server.upstreams() == {"a": pid, "c": server.upstreams()["c"]}
        assert count(server, "config reload: applied") == 1


async def _async(value: bool) -> bool:
    return value
