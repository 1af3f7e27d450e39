"""The official `openai` client via llmswap to real llama-server processes: chat, completions, embeddings,
swaps; and the activity rows they leave.

The models are random noise, so the text is gibberish; what is checked is everything around it: the answer's
shape and model, a finish_reason and usage, a stream that arrives token by token, embeddings as long as the
model's hidden size (64 for `tiny`, 256 for `small`: the vector says which model computed it), that greedy
decoding gives the same text from `tiny` before and after it was swapped out, and other text from `small`.
llama-server serves embeddings only when started with `--embedding`, so they are models of their own, as in
a user's config.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.llamaserver.conftest import START_WITHIN, llamaserver_entry
from tests.helpers.cli import LlmswapProcess, alive, running_llmswap, write_config
from tests.helpers.demo import free_port_run
from tests.helpers.gguf_model import SIZES, tiny_llama
from tests.helpers.sse import parse_events
from tests.helpers.wait import eventually

pytestmark = [pytest.mark.llamaserver, pytest.mark.asyncio(loop_scope="module")]

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something."}]
TOKENS = 6


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(llama_server: str,
                 tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LlmswapProcess]:
    folder = tmp_path_factory.mktemp("openai-llamaserver")
    files = {name: tiny_llama(SIZES[name], folder) for name in ("tiny", "small")}
    models: dict[str, dict[str, Any]] = {}
    for name, gguf in files.items():
        models[name] = llamaserver_entry(llama_server, gguf, kv=False)
        embed = llamaserver_entry(llama_server, gguf, kv=False)
        embed["cmd"] += " --embedding --pooling mean"
        models[f"{name}-embed"] = embed
    config = write_config(folder / "config.yaml", models, healthCheckTimeout=START_WITHIN,
                          startPort=free_port_run(len(models)), kvCache={"dir": str(folder / "kv")})
    async with running_llmswap(config) as running:
        yield running


def client(server: LlmswapProcess) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def upstreams(server: LlmswapProcess) -> dict[str, int]:
    """Model id → PID of every live llama-server this llmswap started."""
    found: dict[str, int] = {}
    import psutil

    for child in psutil.Process(server.pid).children(recursive=True):
        try:
            argv = child.cmdline()
        except psutil.Error:
            continue
        if argv and argv[0].endswith("llama-server") and "--alias" in argv:
            found[argv[argv.index("--alias") + 1]] = child.pid
    return found


async def test_chat_completion(server: LlmswapProcess) -> None:
    async with client(server) as sdk:
        completion = await sdk.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=TOKENS)
    assert completion.model == "tiny"
    assert completion.object == "chat.completion"
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == TOKENS
    assert completion.usage.prompt_tokens > 0
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + TOKENS


async def test_chat_completion_streamed(server: LlmswapProcess) -> None:
    async with client(server) as sdk:
        stream = await sdk.chat.completions.create(model="small", messages=MESSAGES, max_tokens=TOKENS,
                                                   stream=True)
        chunks = [chunk async for chunk in stream]
    assert {chunk.object for chunk in chunks} == {"chat.completion.chunk"}
    assert {chunk.model for chunk in chunks} == {"small"}
    assert len({chunk.id for chunk in chunks}) == 1
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) == TOKENS  # one chunk per token: relayed as generated, not gathered
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length"


async def test_completion_and_its_stream(server: LlmswapProcess) -> None:
    async with client(server) as sdk:
        completion = await sdk.completions.create(model="tiny", prompt="Once upon a time", max_tokens=TOKENS,
                                                  temperature=0)
        stream = await sdk.completions.create(model="tiny", prompt="Once upon a time", max_tokens=TOKENS,
                                              temperature=0, stream=True)
        chunks = [chunk async for chunk in stream]
    assert completion.model == "tiny" and completion.object == "text_completion"
    assert completion.choices[0].text and completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == TOKENS
    texts = [chunk.choices[0].text for chunk in chunks if chunk.choices and chunk.choices[0].text]
    assert len(texts) == TOKENS
    assert "".join(texts) == completion.choices[0].text  # greedy: the same tokens


@pytest.mark.parametrize("size", ["tiny", "small"])
async def test_embeddings_come_from_the_requested_model(server: LlmswapProcess, size: str) -> None:
    async with client(server) as sdk:
        result = await sdk.embeddings.create(model=f"{size}-embed", input=["first text", "second text"])
    vectors = [item.embedding for item in result.data]
    assert [item.index for item in result.data] == [0, 1]
    assert len(vectors[0]) == len(vectors[1]) == SIZES[size].embedding
    assert vectors[0] != vectors[1]
    assert result.usage.prompt_tokens > 0


async def greedy_text(sdk: AsyncOpenAI, model_id: str) -> str:
    completion = await sdk.chat.completions.create(model=model_id, messages=MESSAGES, max_tokens=TOKENS,
                                                   temperature=0)
    assert completion.model == model_id
    return completion.choices[0].message.content or ""


async def test_swaps_stop_the_other_model_and_reload_the_same_one(server: LlmswapProcess) -> None:
    async with client(server) as sdk:
        first_tiny = await greedy_text(sdk, "tiny")
        tiny_pid = upstreams(server)["tiny"]
        small = await greedy_text(sdk, "small")
        assert list(upstreams(server)) == ["small"]
        assert not alive(tiny_pid)
        second_tiny = await greedy_text(sdk, "tiny")
        running = upstreams(server)
        assert list(running) == ["tiny"] and running["tiny"] != tiny_pid  # loaded again from the file
    assert first_tiny and second_tiny == first_tiny
    assert small != first_tiny


async def activity_rows(http: aiohttp.ClientSession, server: LlmswapProcess,
                        count: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    async def enough() -> bool:
        nonlocal found
        async with http.get(f"{server.url}/api/metrics/activity") as response:
            found = (await response.json())["data"]
        return len(found) >= count

    await eventually(enough, within=30, what=f"{count} activity rows")
    return found


async def test_recorded_tokens_are_what_llama_server_reported(server: LlmswapProcess) -> None:
    async with aiohttp.ClientSession() as http:
        body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 5}
        async with http.post(f"{server.url}/v1/chat/completions", json=body) as response:
            whole = await response.json()
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        async with http.post(f"{server.url}/v1/chat/completions", json=streamed) as response:
            events = [json.loads(e.data) for e in parse_events(await response.text()) if e.data != "[DONE]"]
        newest_first = await activity_rows(http, server, 2)
    stream_row, whole_row = newest_first[0], newest_first[1]
    # As llama-swap records them: llama.cpp's timings replace the usage counts, so the input is the prompt
    # tokens computed and the cache tokens the rest (the same prompt twice: the second is a cache hit).
    for row, usage in ((whole_row, whole["usage"]), (stream_row, events[-1]["usage"])):
        tokens = row["tokens"]
        assert tokens["input_tokens"] + tokens["cache_tokens"] == usage["prompt_tokens"]
        assert tokens["output_tokens"] == usage["completion_tokens"]
        assert tokens["tokens_per_second"] > 0
    assert stream_row["tokens"]["cache_tokens"] > 0
