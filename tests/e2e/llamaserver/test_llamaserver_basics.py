"""llmswap in front of llama.cpp's own llama-server, as llama-swap users run it: start on `${PORT}`, the
`/health` check, swaps, streams, and llama-server's own endpoints (`/props`, `/slots`, `/metrics`) through
`/upstream/{model}/`, and the context guardrail fed by `/props`.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.e2e.llamaserver.conftest import CONTEXT, START_WITHIN, llamaserver_entry
from tests.helpers.cli import LlmswapProcess, running_llmswap, write_config
from tests.helpers.demo import free_port_run

pytestmark = [pytest.mark.llamaserver, pytest.mark.asyncio(loop_scope="module")]

MESSAGES = [{"role": "user", "content": "say something"}]
TOKENS = 6


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(ggufs: dict[str, Path], llama_server: str,
                 tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LlmswapProcess]:
    folder = tmp_path_factory.mktemp("llamaserver")
    chat = llamaserver_entry(llama_server, ggufs["chat"], kv=False)
    chat["cmd"] += " --metrics"
    models = {"chat": chat, "other": llamaserver_entry(llama_server, ggufs["other"], kv=False)}
    config = write_config(folder / "config.yaml", models, healthCheckTimeout=START_WITHIN,
                          startPort=free_port_run(len(models)), kvCache={"dir": str(folder / "kv")})
    async with running_llmswap(config) as running:
        yield running


async def call(server: LlmswapProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.request(
            method, f"{server.url}{path}", json=body, timeout=aiohttp.ClientTimeout(total=120)) as response:
        text = await response.text()
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text


async def test_a_chat_starts_the_server_and_answers_in_openai_shape(server: LlmswapProcess) -> None:
    status, body = await call(server, "POST", "/v1/chat/completions",
                              {"model": "chat", "messages": MESSAGES, "max_tokens": TOKENS, "temperature": 0})
    assert status == 200, body
    assert body["object"] == "chat.completion" and body["model"] == "chat"
    assert body["usage"]["completion_tokens"] == TOKENS
    assert body["choices"][0]["finish_reason"] == "length"
    status, running = await call(server, "GET", "/running")
    assert [(entry["model"], entry["state"]) for entry in running["running"]] == [("chat", "ready")]


async def test_a_stream_arrives_token_by_token_and_swaps_the_model(server: LlmswapProcess) -> None:
    payload = {"model": "other", "messages": MESSAGES, "max_tokens": TOKENS, "temperature": 0, "stream": True}
    pieces: list[str] = []
    async with aiohttp.ClientSession() as session, session.post(
            f"{server.url}/v1/chat/completions", json=payload) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        async for raw in response.content:
            line = raw.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]":
                for choice in json.loads(line[5:]).get("choices") or ():
                    if (choice.get("delta") or {}).get("content"):
                        pieces.append(choice["delta"]["content"])
    assert len(pieces) == TOKENS
    _, running = await call(server, "GET", "/running")
    assert [entry["model"] for entry in running["running"]] == ["other"]  # one at a time: chat was stopped


async def test_llama_servers_own_endpoints_pass_through(server: LlmswapProcess) -> None:
    status, props = await call(server, "GET", "/upstream/chat/props")
    assert status == 200 and props["default_generation_settings"]["n_ctx"] == CONTEXT
    status, slots = await call(server, "GET", "/upstream/chat/slots")
    assert status == 200 and [slot["id"] for slot in slots] == [0]
    status, metrics = await call(server, "GET", "/upstream/chat/metrics")
    assert status == 200 and "llamacpp:prompt_tokens_total" in metrics


async def test_a_prompt_longer_than_the_reported_context_is_refused_before_it_waits(
        server: LlmswapProcess) -> None:
    # The first answer teaches llmswap the context (/props).
    await call(server, "POST", "/v1/chat/completions",
               {"model": "chat", "messages": MESSAGES, "max_tokens": 1})
    long = [{"role": "user", "content": "word " * (CONTEXT * 5)}]
    status, body = await call(server, "POST", "/v1/chat/completions",
                              {"model": "chat", "messages": long, "max_tokens": 1})
    assert status == 400, body
    assert body["error"]["code"] == "context_length_exceeded"
    assert f"{CONTEXT}-token context of model chat" in body["error"]["message"]


async def test_the_command_is_shown_as_written(server: LlmswapProcess) -> None:
    started = [line for line in server.stderr_lines + server.stdout_lines if "[chat] starting:" in line]
    assert started and shlex.split(started[0].split("starting: ", 1)[1])[0].endswith("llama-server")
