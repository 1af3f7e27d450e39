"""The demo's OpenAI-compatible routes, checked over real HTTP against one demo process."""

import base64
import math
import struct
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.helpers.demo import DemoProcess, running_demo
from tests.helpers.sse import parse_events

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHAT = {"model": "asked-for", "messages": [{"role": "user", "content": "tell me a story"}]}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def demo() -> AsyncIterator[DemoProcess]:
    async with running_demo("qwen") as process:
        yield process


async def post_json(
    http: aiohttp.ClientSession, url: str, body: object, status: int = 200
) -> dict[str, Any]:
    async with http.post(url, json=body) as response:
        assert response.status == status, await response.text()
        assert response.headers["X-Demo-Model"] == "qwen"
        payload = await response.json()
        assert isinstance(payload, dict)
        return payload


async def post_stream(http: aiohttp.ClientSession, url: str, body: object) -> str:
    async with http.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["X-Demo-Model"] == "qwen"
        return await response.text()


async def test_models_lists_the_demo_model(demo: DemoProcess, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{demo.url}/v1/models") as response:
        assert response.headers["X-Demo-Model"] == "qwen"
        listing = await response.json()
    assert listing["object"] == "list"
    assert [model["id"] for model in listing["data"]] == ["qwen"]


async def test_chat_completion_names_the_serving_model_and_echoes_the_requested_one(
    demo: DemoProcess, http: aiohttp.ClientSession
) -> None:
    reply = await post_json(http, f"{demo.url}/v1/chat/completions", CHAT)
    assert reply["object"] == "chat.completion"
    assert reply["model"] == "asked-for"
    [choice] = reply["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"].startswith("demo qwen says: 1-")
    assert len(choice["message"]["content"].split(" ")) == 16
    assert choice["finish_reason"] == "stop"
    assert reply["usage"] == {"prompt_tokens": 4, "completion_tokens": 16, "total_tokens": 20}
    assert "echo" not in reply


async def test_chat_completion_honours_max_tokens(demo: DemoProcess, http: aiohttp.ClientSession) -> None:
    reply = await post_json(http, f"{demo.url}/v1/chat/completions", {**CHAT, "max_tokens": 5})
    assert len(reply["choices"][0]["message"]["content"].split(" ")) == 5
    assert reply["choices"][0]["finish_reason"] == "length"
    newer = await post_json(http, f"{demo.url}/v1/chat/completions", {**CHAT, "max_completion_tokens": 40})
    assert newer["usage"]["completion_tokens"] == 40


async def test_chat_completion_is_deterministic_per_prompt(
    demo: DemoProcess, http: aiohttp.ClientSession
) -> None:
    first = await post_json(http, f"{demo.url}/v1/chat/completions", CHAT)
    again = await post_json(http, f"{demo.url}/v1/chat/completions", CHAT)
    other = await post_json(
        http, f"{demo.url}/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "hi"}]}
    )
    content = first["choices"][0]["message"]["content"]
    assert again["choices"][0]["message"]["content"] == content
    assert other["choices"][0]["message"]["content"] != content


async def test_chat_stream_uses_openai_chunks_and_ends_with_done(
    demo: DemoProcess, http: aiohttp.ClientSession
) -> None:
    body = {**CHAT, "stream": True, "max_tokens": 6}
    events = parse_events(await post_stream(http, f"{demo.url}/v1/chat/completions", body))
    assert events[-1].data == "[DONE]"
    chunks = [event.json() for event in events[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert all(chunk["model"] == "asked-for" for chunk in chunks)
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(chunk["choices"][0]["finish_reason"] is None for chunk in chunks[:-1])
    text = "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks)
    whole = await post_json(http, f"{demo.url}/v1/chat/completions", {**CHAT, "max_tokens": 6})
    assert text == whole["choices"][0]["message"]["content"]
    assert "usage" not in chunks[-1]


async def test_chat_stream_reports_usage_when_asked(demo: DemoProcess, http: aiohttp.ClientSession) -> None:
    body = {**CHAT, "stream": True, "max_tokens": 3, "stream_options": {"include_usage": True}}
    events = parse_events(await post_stream(http, f"{demo.url}/v1/chat/completions", body))
    assert events[-1].data == "[DONE]"
    last = events[-2].json()
    assert last["choices"] == []
    assert last["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "once upon a time", "max_tokens": 4}),
        ("/completion", {"prompt": "once upon a time", "n_predict": 4}),
        ("/infill", {"input_prefix": "def f(", "input_suffix": "):", "n_predict": 4}),
    ],
)
async def test_text_completion_routes_answer_whole_and_streamed(
    demo: DemoProcess, http: aiohttp.ClientSession, path: str, body: dict[str, object]
) -> None:
    whole = await post_json(http, f"{demo.url}{path}", {"model": "asked-for", **body})
    assert whole["object"] == "text_completion"
    assert whole["model"] == "asked-for"
    text = whole["choices"][0]["text"]
    assert text.startswith("demo qwen says:")
    assert len(text.split(" ")) == 4
    assert whole["choices"][0]["finish_reason"] == "length"
    events = parse_events(await post_stream(http, f"{demo.url}{path}", {**body, "stream": True}))
    assert events[-1].data == "[DONE]"
    chunks = [event.json() for event in events[:-1]]
    assert "".join(chunk["choices"][0]["text"] for chunk in chunks) == text
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_bad_requests_get_a_400_naming_the_field(
    demo: DemoProcess, http: aiohttp.ClientSession
) -> None:
    missing = await post_json(http, f"{demo.url}/v1/completions", {"model": "m"}, status=400)
    assert "prompt is required" in missing["error"]["message"]
    too_long = await post_json(http, f"{demo.url}/v1/chat/completions", {**CHAT, "max_tokens": -1}, 400)
    assert "max_tokens must be an integer" in too_long["error"]["message"]
    async with http.post(f"{demo.url}/v1/chat/completions", data=b"{not json") as response:
        assert response.status == 400
        assert "not valid JSON" in (await response.json())["error"]["message"]


async def test_unknown_paths_and_methods_get_json_errors(
    demo: DemoProcess, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{demo.url}/no/such/route") as response:
        assert response.status == 404
        assert response.headers["X-Demo-Model"] == "qwen"
        error = (await response.json())["error"]
        assert error["message"] == "demo qwen: no route for GET /no/such/route"
    async with http.get(f"{demo.url}/v1/chat/completions") as response:
        assert response.status == 405
        assert "POST" in response.headers["Allow"]
        assert "GET is not allowed" in (await response.json())["error"]["message"]


async def test_embeddings_are_unit_vectors_deterministic_per_input(
    demo: DemoProcess, http: aiohttp.ClientSession
) -> None:
    one = await post_json(http, f"{demo.url}/v1/embeddings", {"model": "e", "input": "alpha"})
    assert one["object"] == "list"
    assert one["model"] == "e"
    [item] = one["data"]
    assert item["object"] == "embedding" and item["index"] == 0
    assert len(item["embedding"]) == 8
    assert math.isclose(math.fsum(x * x for x in item["embedding"]), 1.0)
    assert one["usage"] == {"prompt_tokens": 1, "total_tokens": 1}

    many = await post_json(http, f"{demo.url}/v1/embeddings", {"input": ["alpha", "beta"], "dimensions": 3})
    assert [entry["index"] for entry in many["data"]] == [0, 1]
    assert all(len(entry["embedding"]) == 3 for entry in many["data"])
    assert many["data"][0]["embedding"] != many["data"][1]["embedding"]
    again = await post_json(http, f"{demo.url}/v1/embeddings", {"input": "alpha"})
    assert again["data"][0]["embedding"] == item["embedding"]


async def test_embeddings_in_base64_decode_to_the_float_vector(
    demo: DemoProcess, http: aiohttp.ClientSession
) -> None:
    floats = await post_json(http, f"{demo.url}/v1/embeddings", {"input": "alpha"})
    base64_body = {"input": "alpha", "encoding_format": "base64"}
    packed = await post_json(http, f"{demo.url}/v1/embeddings", base64_body)
    decoded = struct.unpack("<8f", base64.b64decode(packed["data"][0]["embedding"]))
    assert decoded == pytest.approx(floats["data"][0]["embedding"], rel=1e-6)


async def test_embeddings_reject_bad_input(demo: DemoProcess, http: aiohttp.ClientSession) -> None:
    error = await post_json(http, f"{demo.url}/v1/embeddings", {"input": {"text": "x"}}, status=400)
    assert "input must be a string" in error["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/rerank", "/v1/reranking", "/rerank"])
async def test_rerank_orders_documents_by_relevance(
    demo: DemoProcess, http: aiohttp.ClientSession, path: str
) -> None:
    body = {
        "model": "r",
        "query": "red fox",
        "documents": ["blue whale", {"text": "a red car"}, "the quick red fox"],
        "top_n": 2,
        "return_documents": True,
    }
    reply = await post_json(http, f"{demo.url}{path}", body)
    assert reply["model"] == "r"
    assert [result["index"] for result in reply["results"]] == [2, 1]
    scores = [result["relevance_score"] for result in reply["results"]]
    assert scores == sorted(scores, reverse=True)
    assert reply["results"][0]["document"] == {"text": "the quick red fox"}
    assert reply == {**await post_json(http, f"{demo.url}{path}", body), "id": reply["id"]}


async def test_transcription_takes_multipart_and_mentions_the_file_size(
    demo: DemoProcess, http: aiohttp.ClientSession
) -> None:
    form = aiohttp.FormData()
    form.add_field("file", b"\x00" * 1234, filename="clip.wav", content_type="audio/wav")
    form.add_field("model", "whisper")
    async with http.post(f"{demo.url}/v1/audio/transcriptions", data=form) as response:
        assert response.status == 200
        assert response.headers["X-Demo-Model"] == "qwen"
        assert await response.json() == {"text": "demo qwen heard 1234 bytes of audio in clip.wav"}

    text_form = aiohttp.FormData()
    text_form.add_field("file", b"abc", filename="a.mp3")
    text_form.add_field("response_format", "text")
    async with http.post(f"{demo.url}/v1/audio/transcriptions", data=text_form) as response:
        assert response.content_type == "text/plain"
        assert await response.text() == "demo qwen heard 3 bytes of audio in a.mp3"


async def test_transcription_without_a_file_is_a_400(demo: DemoProcess, http: aiohttp.ClientSession) -> None:
    form = aiohttp.FormData()
    form.add_field("model", "whisper")
    form.add_field("nothing", b"", filename="x")  # forces multipart
    async with http.post(f"{demo.url}/v1/audio/transcriptions", data=form) as response:
        assert response.status == 400
        assert "file is required" in (await response.json())["error"]["message"]


async def test_transcription_of_a_json_body_asks_for_multipart(
    demo: DemoProcess, http: aiohttp.ClientSession
) -> None:
    error = await post_json(http, f"{demo.url}/v1/audio/transcriptions", {"file": "x"}, status=400)
    assert "needs a multipart/form-data body" in error["error"]["message"]


async def test_speech_returns_wav_audio(demo: DemoProcess, http: aiohttp.ClientSession) -> None:
    async with http.post(f"{demo.url}/v1/audio/speech", json={"model": "tts", "input": "hello"}) as response:
        assert response.status == 200
        assert response.content_type == "audio/wav"
        assert response.headers["X-Demo-Model"] == "qwen"
        audio = await response.read()
    assert audio[:4] == b"RIFF" and audio[8:12] == b"WAVE"
    assert struct.unpack("<I", audio[4:8])[0] == len(audio) - 8


async def test_image_generation_and_edit_return_pngs(demo: DemoProcess, http: aiohttp.ClientSession) -> None:
    generated = await post_json(http, f"{demo.url}/v1/images/generations", {"prompt": "a cat", "n": 2})
    assert len(generated["data"]) == 2
    assert base64.b64decode(generated["data"][0]["b64_json"]).startswith(b"\x89PNG\r\n\x1a\n")
    assert generated["data"][0]["revised_prompt"] == "demo qwen drew: a cat"

    form = aiohttp.FormData()
    form.add_field("image", b"\x89PNG....", filename="in.png", content_type="image/png")
    form.add_field("prompt", "add a hat")
    async with http.post(f"{demo.url}/v1/images/edits", data=form) as response:
        assert response.status == 200
        edited = await response.json()
    assert edited["data"][0]["revised_prompt"] == "demo qwen edited 8 bytes of in.png: add a hat"


async def test_voices_and_props_describe_the_demo(demo: DemoProcess, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{demo.url}/v1/audio/voices", params={"model": "tts"}) as response:
        voices = await response.json()
    assert voices["model"] == "tts" and voices["voices"]
    async with http.get(f"{demo.url}/props") as response:
        props = await response.json()
    assert props["demo"]["model_name"] == "qwen"
    assert props["demo"]["pid"] == demo.pid
    assert props["demo"]["healthy"] is True
    assert props["demo"]["generations_in_progress"] == 0


async def test_responses_api_answers_whole_and_streamed(
    demo: DemoProcess, http: aiohttp.ClientSession
) -> None:
    body = {"model": "asked-for", "input": "hello there", "max_output_tokens": 5}
    whole = await post_json(http, f"{demo.url}/v1/responses", body)
    assert whole["object"] == "response" and whole["status"] == "completed"
    assert whole["model"] == "asked-for"
    [message] = whole["output"]
    text = message["content"][0]["text"]
    assert message["content"][0]["type"] == "output_text"
    assert text.startswith("demo qwen says:") and len(text.split(" ")) == 5

    events = parse_events(await post_stream(http, f"{demo.url}/v1/responses", {**body, "stream": True}))
    kinds = [event.name for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") == 5
    datas = [event.json() for event in events]
    assert [data["type"] for data in datas] == kinds
    assert [data["sequence_number"] for data in datas] == list(range(len(datas)))
    deltas = "".join(data["delta"] for data in datas if data["type"] == "response.output_text.delta")
    assert deltas == text
    assert datas[-1]["response"]["output"][0]["content"][0]["text"] == text


async def test_chat_reports_llamacpp_timings_whole_and_streamed(
    demo: DemoProcess, http: aiohttp.ClientSession
) -> None:
    whole = await post_json(http, f"{demo.url}/v1/chat/completions", {**CHAT, "max_tokens": 4})
    timings = whole["timings"]
    assert timings["prompt_n"] == whole["usage"]["prompt_tokens"]
    assert timings["predicted_n"] == whole["usage"]["completion_tokens"] == 4
    assert timings["predicted_ms"] >= 0 and timings["prompt_per_second"] >= 0

    streamed = {**CHAT, "max_tokens": 3, "stream": True}
    text = await post_stream(http, f"{demo.url}/v1/chat/completions", streamed)
    events = [event for event in parse_events(text) if event.data != "[DONE]"]
    last_with_finish = [event.json() for event in events if event.json()["choices"]
                        and event.json()["choices"][0]["finish_reason"]]
    assert last_with_finish[-1]["timings"]["predicted_n"] == 3


async def test_completion_stream_ends_with_timings(demo: DemoProcess, http: aiohttp.ClientSession) -> None:
    body = {"prompt": "once", "max_tokens": 2, "stream": True}
    text = await post_stream(http, f"{demo.url}/completion", body)
    events = [event.json() for event in parse_events(text) if event.data != "[DONE]"]
    assert events[-1]["timings"]["predicted_n"] == 2
