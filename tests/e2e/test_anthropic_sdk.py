"""The official `anthropic` package against llmswap's `/v1/messages`: whole and streamed."""

from __future__ import annotations

import anthropic
import pytest
from anthropic import AsyncAnthropic

from tests.e2e.conftest import API_KEY
from tests.helpers.cli import LlmswapProcess

pytestmark = pytest.mark.asyncio(loop_scope="module")

MESSAGES = [{"role": "user", "content": "Say something."}]


def client(server: LlmswapProcess, api_key: str = API_KEY) -> AsyncAnthropic:
    return AsyncAnthropic(base_url=server.url, api_key=api_key, max_retries=0, timeout=30)


async def test_message(llmswap: LlmswapProcess) -> None:
    async with client(llmswap) as sdk:
        message = await sdk.messages.create(model="chat", max_tokens=6, messages=MESSAGES)
    assert message.role == "assistant"
    assert message.model == "chat"
    assert message.stop_reason == "max_tokens"
    assert message.content[0].type == "text"
    assert message.content[0].text.startswith("demo chat says")
    assert message.usage.output_tokens > 0


async def test_message_streamed(llmswap: LlmswapProcess) -> None:
    sdk = client(llmswap)
    async with sdk, sdk.messages.stream(model="chat", max_tokens=6, messages=MESSAGES) as stream:
        pieces = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert len(pieces) > 1
    assert "".join(pieces).startswith("demo chat says")
    assert final.content[0].type == "text"
    assert final.content[0].text == "".join(pieces)
    assert final.stop_reason == "max_tokens"


async def test_wrong_api_key_is_refused(llmswap: LlmswapProcess) -> None:
    async with client(llmswap, api_key="sk-wrong") as sdk:
        with pytest.raises(anthropic.AuthenticationError):
            await sdk.messages.create(model="chat", max_tokens=6, messages=MESSAGES)
