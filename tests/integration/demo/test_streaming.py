"""Streaming is truly incremental: chunks reach the client while the demo is still generating the rest."""

import asyncio
import json

import aiohttp
import pytest

from tests.helpers.demo import DemoProcess, running_demo
from tests.helpers.wait import eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")

# Slow enough that a whole answer takes about 20 s, so the checks below cannot race its end;
# the tests leave long before that.
SLOW = ["--tokens-per-second", "5"]
TOKENS = 100


async def generation_state(http: aiohttp.ClientSession, demo: DemoProcess) -> dict[str, int]:
    async with http.get(f"{demo.url}/props") as response:
        state = (await response.json())["demo"]
    return {"in_progress": state["generations_in_progress"], "tokens": state["tokens_generated"]}


async def wait_until_generating(http: aiohttp.ClientSession, demo: DemoProcess, count: int) -> None:
    async def reached() -> bool:
        return (await generation_state(http, demo))["in_progress"] == count

    await eventually(reached, what=f"{count} generations in progress")


async def test_first_chunk_arrives_while_the_rest_is_still_being_generated(
    http: aiohttp.ClientSession,
) -> None:
    async with running_demo("slow", SLOW) as demo:
        body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": TOKENS, "stream": True}
        async with http.post(f"{demo.url}/v1/chat/completions", json=body) as response:
            role_line = await response.content.readline()
            assert json.loads(role_line.removeprefix(b"data: "))["choices"][0]["delta"]["role"] == "assistant"
            assert await response.content.readline() == b"\n"
            first_token = json.loads((await response.content.readline()).removeprefix(b"data: "))
            assert first_token["choices"][0]["delta"]["content"] == "demo"

            # The client holds the first token, and the server reports the same answer still in progress.
            state = await generation_state(http, demo)
            assert state["in_progress"] == 1
            assert 1 <= state["tokens"] < TOKENS
            assert not response.content.at_eof()
        # Leaving the block hung up mid-answer: the demo notices and stops generating for nobody.
        await wait_until_generating(http, demo, 0)
        assert (await generation_state(http, demo))["tokens"] < TOKENS


async def test_anthropic_stream_is_incremental_too(http: aiohttp.ClientSession) -> None:
    async with running_demo("slow", SLOW) as demo:
        body = {"max_tokens": TOKENS, "stream": True, "messages": [{"role": "user", "content": "go"}]}
        async with http.post(f"{demo.url}/v1/messages", json=body) as response:
            seen: list[bytes] = []
            while not any(b"content_block_delta" in line for line in seen):
                seen.append(await response.content.readline())
            state = await generation_state(http, demo)
            assert state["in_progress"] == 1 and state["tokens"] < TOKENS
        await wait_until_generating(http, demo, 0)


async def test_a_slow_answer_neither_holds_up_others_nor_outlives_its_client(
    http: aiohttp.ClientSession,
) -> None:
    async with running_demo("slow", SLOW) as demo:
        body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": TOKENS}
        slow = asyncio.create_task(http.post(f"{demo.url}/v1/chat/completions", json=body))
        try:
            await wait_until_generating(http, demo, 1)
            quick = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 2}
            async with http.post(f"{demo.url}/v1/chat/completions", json=quick) as response:
                assert response.status == 200
            assert not slow.done()
        finally:
            slow.cancel()
            await asyncio.gather(slow, return_exceptions=True)
        # The client gave up on a whole (non-streamed) answer: the demo stops generating it.
        await wait_until_generating(http, demo, 0)
