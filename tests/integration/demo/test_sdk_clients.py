"""The official OpenAI and Anthropic Python SDKs can talk to the demo: its shapes are the real ones."""

from collections.abc import AsyncIterator

import anthropic
import openai
import pytest
import pytest_asyncio

from tests.helpers.demo import DemoProcess, running_demo

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def demo() -> AsyncIterator[DemoProcess]:
    async with running_demo("sdk-model") as process:
        yield process


@pytest_asyncio.fixture(loop_scope="module")
async def openai_client(demo: DemoProcess) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(base_url=f"{demo.url}/v1", api_key="unused", max_retries=0)
    yield client
    await client.close()


@pytest_asyncio.fixture(loop_scope="module")
async def anthropic_client(demo: DemoProcess) -> AsyncIterator[anthropic.AsyncAnthropic]:
    client = anthropic.AsyncAnthropic(base_url=demo.url, api_key="unused", max_retries=0)
    yield client
    await client.close()


async def test_openai_sdk_chat_whole_and_streamed(openai_client: openai.AsyncOpenAI) -> None:
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    whole = await openai_client.chat.completions.create(model="m", messages=messages, max_tokens=7)
    content = whole.choices[0].message.content
    assert content is not None and content.startswith("demo sdk-model says:")
    assert whole.usage is not None and whole.usage.completion_tokens == 7

    stream = await openai_client.chat.completions.create(
        model="m", messages=messages, max_tokens=7, stream=True, stream_options={"include_usage": True}
    )
    pieces: list[str] = []
    usage = None
    async for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        usage = chunk.usage or usage
    assert "".join(pieces) == content
    assert usage is not None and usage.completion_tokens == 7


async def test_openai_sdk_completions_embeddings_models(openai_client: openai.AsyncOpenAI) -> None:
    completion = await openai_client.completions.create(model="m", prompt="once", max_tokens=3)
    assert completion.choices[0].text == "demo sdk-model says:"
    embedded = await openai_client.embeddings.create(model="e", input=["a", "b"])  # base64 on the wire
    assert [len(item.embedding) for item in embedded.data] == [8, 8]
    assert [model.id async for model in openai_client.models.list()] == ["sdk-model"]


async def test_openai_sdk_audio_images_responses(openai_client: openai.AsyncOpenAI) -> None:
    transcript = await openai_client.audio.transcriptions.create(model="w", file=("a.wav", b"12345"))
    assert transcript.text == "demo sdk-model heard 5 bytes of audio in a.wav"
    speech = await openai_client.audio.speech.create(model="t", input="hi", voice="alloy")
    assert speech.content.startswith(b"RIFF")
    image = await openai_client.images.generate(model="i", prompt="cat")
    assert image.data and image.data[0].revised_prompt == "demo sdk-model drew: cat"
    response = await openai_client.responses.create(model="m", input="hello", max_output_tokens=4)
    assert response.output_text.startswith("demo sdk-model says:")
    async with openai_client.responses.stream(model="m", input="hello", max_output_tokens=4) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_response()
    assert final.output_text == response.output_text


async def test_anthropic_sdk_messages_whole_streamed_and_counted(
    anthropic_client: anthropic.AsyncAnthropic,
) -> None:
    messages: list[anthropic.types.MessageParam] = [{"role": "user", "content": "hello there"}]
    message = await anthropic_client.messages.create(model="claude", max_tokens=5, messages=messages)
    assert message.content[0].type == "text"
    text = message.content[0].text
    assert text.startswith("demo sdk-model says:")
    assert message.stop_reason == "max_tokens"
    async with anthropic_client.messages.stream(model="claude", max_tokens=5, messages=messages) as stream:
        streamed = "".join([piece async for piece in stream.text_stream])
    assert streamed == text
    counted = await anthropic_client.messages.count_tokens(model="claude", messages=messages)
    assert counted.input_tokens == 2
