"""The official `openai` package against llmswap: chat (whole and streamed), embeddings, the model list."""

from __future__ import annotations

import openai
import pytest
from openai import AsyncOpenAI

from tests.e2e.conftest import API_KEY
from tests.helpers.cli import LlmswapProcess

pytestmark = pytest.mark.asyncio(loop_scope="module")

MESSAGES = [{"role": "user", "content": "Say something."}]


def client(server: LlmswapProcess, api_key: str = API_KEY) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{server.url}/v1", api_key=api_key, max_retries=0, timeout=30)


async def test_chat_completion(llmswap: LlmswapProcess) -> None:
    async with client(llmswap) as sdk:
        completion = await sdk.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=6)
    assert completion.model == "chat"
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content is not None and choice.message.content.startswith("demo chat says")
    assert choice.finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens > 0


async def test_chat_completion_streamed(llmswap: LlmswapProcess) -> None:
    async with client(llmswap) as sdk:
        stream = await sdk.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=6, stream=True)
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("demo chat says")
    assert len(chunks) > 2  # it really came in pieces
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


async def test_embeddings(llmswap: LlmswapProcess) -> None:
    async with client(llmswap) as sdk:
        result = await sdk.embeddings.create(model="embed", input=["first text", "second text"])
    vectors = [item.embedding for item in result.data]
    assert len(vectors) == 2
    assert len(vectors[0]) == len(vectors[1]) > 0
    assert vectors[0] != vectors[1]
    assert all(isinstance(x, float) for x in vectors[0])


async def test_models_list(llmswap: LlmswapProcess) -> None:
    async with client(llmswap) as sdk:
        page = await sdk.models.list()
        ids = sorted(model.id for model in page.data)
    assert ids == ["chat", "embed"]


async def test_unknown_model_is_not_found(llmswap: LlmswapProcess) -> None:
    async with client(llmswap) as sdk:
        with pytest.raises(openai.NotFoundError) as raised:
            await sdk.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert raised.value.status_code == 404


async def test_wrong_api_key_is_refused(llmswap: LlmswapProcess) -> None:
    async with client(llmswap, api_key="sk-wrong") as sdk:
        with pytest.raises(openai.AuthenticationError):
            await sdk.models.list()
