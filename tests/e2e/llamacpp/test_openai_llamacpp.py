"""The official `openai` client via llmswap to real llama.cpp servers: chat, completions, embeddings, swaps.

The models are random noise, so the text is gibberish; what is checked is everything around it: the answer's
shape and model, a finish_reason and usage, a stream that arrives token by token, embeddings as long as the
model's hidden size (64 for `tiny`, 256 for `small`: the vector says which model computed it), and that greedy
decoding gives the same text from `tiny` before and after it was swapped out, and other text from `small`.
"""

from __future__ import annotations

import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.llamacpp.conftest import llamacpp_upstreams
from tests.helpers.cli import LlmswapProcess, alive
from tests.helpers.gguf_model import SIZES

pytestmark = [pytest.mark.llamacpp, pytest.mark.asyncio(loop_scope="module")]

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something."}]
TOKENS = 6


def client(server: LlmswapProcess) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


async def test_chat_completion(llamacpp_llmswap: LlmswapProcess) -> None:
    async with client(llamacpp_llmswap) as sdk:
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


async def test_chat_completion_streamed(llamacpp_llmswap: LlmswapProcess) -> None:
    async with client(llamacpp_llmswap) as sdk:
        stream = await sdk.chat.completions.create(model="small", messages=MESSAGES, max_tokens=TOKENS,
                                                   stream=True)
        chunks = [chunk async for chunk in stream]
    assert {chunk.object for chunk in chunks} == {"chat.completion.chunk"}
    assert {chunk.model for chunk in chunks} == {"small"}
    assert len({chunk.id for chunk in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) == TOKENS  # one chunk per token: relayed as generated, not gathered
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length"
    assert all(finish is None for finish in finishes[:-1])


async def test_completion(llamacpp_llmswap: LlmswapProcess) -> None:
    async with client(llamacpp_llmswap) as sdk:
        completion = await sdk.completions.create(model="tiny", prompt="Once upon a time", max_tokens=TOKENS)
    assert completion.model == "tiny"
    assert completion.object == "text_completion"
    assert completion.choices[0].text
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == TOKENS


async def test_completion_streamed(llamacpp_llmswap: LlmswapProcess) -> None:
    async with client(llamacpp_llmswap) as sdk:
        stream = await sdk.completions.create(model="small", prompt="Once upon a time", max_tokens=TOKENS,
                                              stream=True)
        chunks = [chunk async for chunk in stream]
    assert {chunk.model for chunk in chunks} == {"small"}
    texts = [chunk.choices[0].text for chunk in chunks if chunk.choices and chunk.choices[0].text]
    assert len(texts) == TOKENS
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


@pytest.mark.parametrize("model_id", ["tiny", "small"])
async def test_embeddings_come_from_the_requested_model(llamacpp_llmswap: LlmswapProcess,
                                                        model_id: str) -> None:
    async with client(llamacpp_llmswap) as sdk:
        result = await sdk.embeddings.create(model=model_id, input=["first text", "second text"])
    assert result.model == model_id
    vectors = [item.embedding for item in result.data]
    assert [item.index for item in result.data] == [0, 1]
    assert len(vectors[0]) == len(vectors[1]) == SIZES[model_id].embedding
    assert vectors[0] != vectors[1]
    assert all(isinstance(x, float) for x in vectors[0])
    assert result.usage.prompt_tokens > 0


async def greedy_text(sdk: AsyncOpenAI, model_id: str) -> str:
    completion = await sdk.chat.completions.create(model=model_id, messages=MESSAGES, max_tokens=TOKENS,
                                                   temperature=0)
    assert completion.model == model_id
    assert completion.choices[0].finish_reason == "length"
    return completion.choices[0].message.content or ""


async def test_swaps_stop_the_other_model_and_reload_the_same_one(llamacpp_llmswap: LlmswapProcess) -> None:
    async with client(llamacpp_llmswap) as sdk:
        first_tiny = await greedy_text(sdk, "tiny")
        tiny_pid = llamacpp_upstreams(llamacpp_llmswap)["tiny"]

        small = await greedy_text(sdk, "small")
        upstreams = llamacpp_upstreams(llamacpp_llmswap)
        assert list(upstreams) == ["small"]
        assert not alive(tiny_pid)

        second_tiny = await greedy_text(sdk, "tiny")
        upstreams = llamacpp_upstreams(llamacpp_llmswap)
        assert list(upstreams) == ["tiny"]
        assert upstreams["tiny"] != tiny_pid  # a new llama.cpp process, loaded again from the file

    assert first_tiny and second_tiny == first_tiny
    assert small != first_tiny
