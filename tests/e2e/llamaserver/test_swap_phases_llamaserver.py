"""A swap phase by phase over real llama-server processes: while `warm` (kvCache) streams a long answer, a
request for `other` waits for it to drain, and `other`'s GGUF is read into the page cache meanwhile (checked
with mincore, before `other`'s server was started); the swap's phases are drain, save, stop, prefetch and
start, with no restore (`other` has no save). Back to `warm`: restore, and no drain (nothing was in flight).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.e2e.llamaserver.conftest import START_WITHIN, llamaserver_entry
from tests.helpers.cli import LlmswapProcess, running_llmswap, write_config
from tests.helpers.demo import free_port_run
from tests.helpers.pagecache import drop, resident_fraction
from tests.helpers.wait import eventually

pytestmark = [pytest.mark.llamaserver, pytest.mark.timeout(300)]


def body(model: str, tokens: int, *, stream: bool = False) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "tell me more about the sea"}],
            "max_tokens": tokens, "temperature": 0, "stream": stream, "ignore_eos": True}


async def chat(http: aiohttp.ClientSession, server: LlmswapProcess, model: str) -> None:
    async with http.post(f"{server.url}/v1/chat/completions", json=body(model, 4)) as response:
        assert response.status == 200, await response.text()


async def running_models(http: aiohttp.ClientSession, server: LlmswapProcess) -> list[str]:
    async with http.get(f"{server.url}/running") as response:
        return [entry["model"] for entry in (await response.json())["running"]]


async def access_line(server: LlmswapProcess, model: str, nth: int) -> str:
    def lines() -> list[str]:
        return [line for line in server.stdout_lines + server.stderr_lines
                if '"POST /v1/chat/completions" 200' in line and f"model={model} " in line]

    async def written() -> bool:
        return len(lines()) >= nth

    await eventually(written, what=f"access line {nth} of {model}")
    return lines()[nth - 1]


async def test_the_swap_to_a_model_reads_its_weights_during_the_drain_and_names_its_phases(
        llama_server: str, ggufs: dict[str, Path], tmp_path: Path) -> None:
    models = {"warm": llamaserver_entry(llama_server, ggufs["chat"], kv=True),
              "other": llamaserver_entry(llama_server, ggufs["other"], kv=False)}
    config = write_config(tmp_path / "config.yaml", models, healthCheckTimeout=START_WITHIN, logLevel="info",
                          startPort=free_port_run(len(models)), kvCache={"dir": str(tmp_path / "kv")})
    weights = ggufs["other"]
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        await chat(http, server, "warm")
        drop(weights)
        assert resident_fraction(weights) < 0.5
        streamed = body("warm", 400, stream=True)
        async with http.post(f"{server.url}/v1/chat/completions", json=streamed) as warm:
            await warm.content.readline()
            asked = asyncio.create_task(chat(http, server, "other"))

            async def read_ahead() -> bool:
                return resident_fraction(weights) > 0.95

            await eventually(read_ahead, what="other's GGUF in the page cache")
            assert not warm.content.at_eof() and await running_models(http, server) == ["warm"]
            tail = (await warm.read()).decode()
            events = [json.loads(line[5:]) for line in tail.splitlines() if line.startswith("data: {")]
            assert "[DONE]" in tail and not any(event.get("error") for event in events)
        await asked
        swap = await access_line(server, "other", 1)
        phases = swap.split(" phases=")[1].split(" ")[0]
        assert [part.split(":")[0] for part in phases.split(",")] == ["drain", "save", "stop", "prefetch",
                                                                      "start"], swap
        await chat(http, server, "warm")
        back = await access_line(server, "warm", 3)
        phases = back.split(" phases=")[1].split(" ")[0]
        names = [part.split(":")[0] for part in phases.split(",")]
        assert "drain" not in names and names[-2:] == ["start", "restore"], back
