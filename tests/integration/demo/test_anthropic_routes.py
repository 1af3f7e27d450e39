"""The demo's Anthropic Messages routes, checked over real HTTP against one demo process."""

from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

from tests.helpers.demo import DemoProcess, running_demo
from tests.helpers.sse import parse_events

pytestmark = pytest.mark.asyncio(loop_scope="module")

MESSAGE = {
    "model": "claude-ish",
    "max_tokens": 6,
    "system": "be brief",
    "messages": [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}],
}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def demo() -> AsyncIterator[DemoProcess]:
    async with running_demo("sonnet") as process:
        yield process


async def test_message_has_anthropic_shape(demo: DemoProcess, http: aiohttp.ClientSession) -> None:
    async with http.post(f"{demo.url}/v1/messages", json=MESSAGE) as response:
        assert response.status == 200
        assert response.headers["X-Demo-Model"] == "sonnet"
        message = await response.json()
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["model"] == "claude-ish"
    [block] = message["content"]
    assert block["type"] == "text"
    assert block["text"].startswith("demo sonnet says:") and len(block["text"].split(" ")) == 6
    assert message["stop_reason"] == "max_tokens"
    assert message["usage"] == {"input_tokens": 4, "output_tokens": 6}


async def test_message_without_max_tokens_ends_its_turn(
    demo: DemoProcess, http: aiohttp.ClientSession
) -> None:
    body = {key: value for key, value in MESSAGE.items() if key != "max_tokens"}
    async with http.post(f"{demo.url}/v1/messages", json=body) as response:
        message = await response.json()
    assert message["stop_reason"] == "end_turn"
    assert message["usage"]["output_tokens"] == 16


async def test_message_stream_sends_anthropic_events_in_order(
    demo: DemoProcess, http: aiohttp.ClientSession
) -> None:
    async with http.post(f"{demo.url}/v1/messages", json={**MESSAGE, "stream": True}) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = parse_events(await response.text())
    names = [event.name for event in events]
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * 6,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    datas = [event.json() for event in events]
    assert [data["type"] for data in datas] == names
    assert datas[0]["message"]["model"] == "claude-ish"
    text = "".join(data["delta"]["text"] for data in datas if data["type"] == "content_block_delta")
    assert text.startswith("demo sonnet says:")
    assert datas[-2]["delta"]["stop_reason"] == "max_tokens"
    assert datas[-2]["usage"] == {"output_tokens": 6}


async def test_count_tokens_counts_system_and_messages(
    demo: DemoProcess, http: aiohttp.ClientSession
) -> None:
    async with http.post(f"{demo.url}/v1/messages/count_tokens", json=MESSAGE) as response:
        assert await response.json() == {"input_tokens": 4}


async def test_errors_use_anthropic_shape(demo: DemoProcess, http: aiohttp.ClientSession) -> None:
    async with http.post(f"{demo.url}/v1/messages", json={"model": "x", "max_tokens": 3}) as response:
        assert response.status == 400
        error = await response.json()
    assert error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert "messages is required" in error["error"]["message"]
