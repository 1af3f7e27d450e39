"""Peers chosen by their live state, with two real llmswaps on loopback: `a` defines model `m` and follows `b`
(`discover: true`), which defines `m` too and has it loaded. A request to `a` goes where `m` is ready, and
stays on `a` once `b` is gone or when it was forwarded already.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp

from tests.helpers.cli import LlmswapProcess, demo_model, running_llmswap, write_config
from tests.helpers.wait import eventually


async def chat(server: LlmswapProcess, **headers: str) -> int:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    async with aiohttp.ClientSession() as http, http.post(f"{server.url}/v1/chat/completions", json=body,
                                                           headers=headers) as response:
        await response.read()
        return response.status


def access_lines(server: LlmswapProcess) -> list[str]:
    output = server.stdout_lines + server.stderr_lines
    return [line for line in output if '"POST /v1/chat/completions"' in line]


async def get_hosts(server: LlmswapProcess) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/api/hosts") as response:
        assert response.status == 200
        return list((await response.json())["hosts"])


async def cli(*args: str) -> str:
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "llmswap", *args,
                                                   stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, out
    return out.decode()


async def nth_line(server: LlmswapProcess, count: int) -> str:
    """The `count`th access line of a chat (written just after the answer: wait for it)."""
    async def written() -> bool:
        return len(access_lines(server)) >= count

    await eventually(written, what=f"access line {count}")
    return access_lines(server)[count - 1]


async def test_a_model_ready_on_the_peer_is_served_there_until_the_peer_goes(tmp_path: Path) -> None:
    preload = {"on_startup": {"preload": ["m"]}}
    b_config = write_config(tmp_path / "b.yaml", {"m": demo_model("m")}, hooks=preload)
    async with running_llmswap(b_config) as b:
        await b.wait_for_output("preload: m ready")
        a_config = write_config(tmp_path / "a.yaml", {"m": demo_model("m", "--startup-delay", "0.5")},
                                peers={"b": {"proxy": b.url, "discover": True}})
        async with running_llmswap(a_config) as a:
            await a.wait_for_output("peer b: following its state")
            hosts = await get_hosts(a)
            assert [(h["name"], h["fresh"], h["url"]) for h in hosts] == [("this host", True, None),
                                                                           ("b", True, b.url)]
            assert {m["id"]: m["state"] for m in hosts[1]["models"]} == {"m": "ready"}
            listed = await cli("ps", "--all-hosts", "--url", a.url)
            assert ["b", "live", "m", "ready", "0", "0"] in [line.split() for line in listed.splitlines()]
            assert await chat(a) == 200
            line = await nth_line(a, 1)
            assert "model=b/m" in line and 'placed="ready with room on b"' in line
            assert a.upstreams() == {}  # a's own m never started
            assert "model=m" in await nth_line(b, 1)

            # Forwarded already (as another llmswap marks it): served here, never forwarded again.
            assert await chat(a, **{"X-Llmswap-Forwarded": "1"}) == 200
            line = await nth_line(a, 2)
            assert "model=m" in line and "placed=" not in line
            assert list(a.upstreams()) == ["m"]

            os.kill(b.pid, signal.SIGKILL)
            await b.process.wait()
            await a.wait_for_output("peer b: its events stream closed")
            hosts = await get_hosts(a)
            assert [(h["name"], h["fresh"]) for h in hosts] == [("this host", True), ("b", False)]
            assert await chat(a) == 200
            line = await nth_line(a, 3)
            assert "model=m" in line and "b/m" not in line and "b down or stale" in line



async def test_a_peer_that_dies_mid_stream_is_skipped_for_the_next_request(tmp_path: Path) -> None:
    preload = {"on_startup": {"preload": ["m"]}}
    b_config = write_config(tmp_path / "b.yaml", {"m": demo_model("m", "--tokens-per-second", "5")},
                            hooks=preload)
    async with running_llmswap(b_config) as b:
        await b.wait_for_output("preload: m ready")
        a_config = write_config(tmp_path / "a.yaml", {"m": demo_model("m")},
                                peers={"b": {"proxy": b.url, "discover": True}})
        async with running_llmswap(a_config) as a:
            await a.wait_for_output("peer b: following its state")
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100,
                    "stream": True}
            async with aiohttp.ClientSession() as http, http.post(f"{a.url}/v1/chat/completions",
                                                                   json=body) as stream:
                assert stream.status == 200
                await stream.content.readline()
                os.kill(b.pid, signal.SIGKILL)  # the peer dies while it answers
                rest = (await stream.read()).decode()
            assert "error" in rest  # the client is told, in its stream
            await b.process.wait()
            await a.wait_for_output("peer b: its events stream closed")
            assert await chat(a) == 200
            line = await nth_line(a, 2)
            assert "model=m" in line and "b/m" not in line


async def get_model_ids(server: LlmswapProcess) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/v1/models") as response:
        assert response.status == 200
        return list((await response.json())["data"])


async def test_a_model_only_a_discover_peer_defines_is_served_through_it_and_listed_once(
        tmp_path: Path) -> None:
    b_config = write_config(tmp_path / "b.yaml", {"q": demo_model("q")})
    async with running_llmswap(b_config) as b:
        a_config = write_config(tmp_path / "a.yaml", {"m": demo_model("m")},
                                peers={"b": {"proxy": b.url, "discover": True}})
        async with running_llmswap(a_config) as a:
            await a.wait_for_output("peer b: following its state")
            listed = [(m["id"], m["meta"]["llamaswap"]) for m in await get_model_ids(a)]
            assert [entry for entry in listed if entry[0] == "q"] == [
                ("q", {"type": "peer", "peerID": "b", "peers": ["b"]})]
            body = {"model": "q", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            async with aiohttp.ClientSession() as http, http.post(f"{a.url}/v1/chat/completions",
                                                                   json=body) as response:
                assert response.status == 200, await response.text()
            line = await nth_line(a, 1)
            assert "model=b/q" in line and 'placed="loads on b evicting nothing busy"' in line
            assert "model=q" in await nth_line(b, 1)  # one hop: b served it itself
            assert a.upstreams() == {}

            os.kill(b.pid, signal.SIGKILL)
            await b.process.wait()
            await a.wait_for_output("peer b: its events stream closed")
            async with aiohttp.ClientSession() as http, http.post(f"{a.url}/v1/chat/completions",
                                                                   json=body) as response:
                assert response.status == 404
                message = (await response.json())["error"]["message"]
            assert "'q'" in message and "b defined it but is down or not answering" in message
            assert "q" not in [m["id"] for m in await get_model_ids(a)]


async def test_a_peer_that_never_answers_is_named_in_a_warning_once(tmp_path: Path) -> None:
    from tests.helpers.demo import free_port

    away = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    config = write_config(tmp_path / "a.yaml", {"m": demo_model("m")}, peers={"b": {"proxy": away,
                                                                                   "discover": True}})
    async with running_llmswap(config) as a:
        line = await a.wait_for_output("peer b: cannot follow its state")
        assert f"{away}/api/events" in line and "not a candidate until it answers" in line
        assert await chat(a) == 200  # served here meanwhile
        assert len([x for x in a.stdout_lines + a.stderr_lines if "peer b: cannot follow" in x]) == 1
