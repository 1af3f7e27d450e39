"""The demo's OpenAI media routes: audio transcription and speech, voices, image generation and edits.

Nothing is transcribed or drawn: answers have the shapes clients decode (text, a silent WAV, a 1x1 PNG).
"""

import struct
from collections.abc import Mapping

from aiohttp import web

from llmswap.demo.context import Demo, created, json_object, string_field
from llmswap.demo.received import Received, received
from llmswap.demo.replies import BadRequest

# A valid 1x1 PNG: the demo draws nothing, but clients can decode what it returns.
_PNG_1X1 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
_SAMPLE_RATE = 16_000


def _form(got: Received) -> dict[str, object]:
    content_type = got.headers.get("Content-Type", "")
    if not isinstance(got.body, dict) or not content_type.startswith("multipart/form-data"):
        raise BadRequest(f"{got.path} needs a multipart/form-data body, got Content-Type {content_type!r}")
    return got.body


def _file_field(form: Mapping[str, object], *names: str) -> dict[str, object]:
    for name in names:
        value = form.get(name)
        if isinstance(value, dict) and "size" in value:
            return value
    raise BadRequest(f"{names[0]} is required: a multipart file field")


async def transcriptions(demo: Demo, request: web.Request) -> web.StreamResponse:
    got = await received(request)
    form = _form(got)
    audio = _file_field(form, "file")
    text = f"demo {demo.name} heard {audio['size']} bytes of audio in {audio['filename']}"
    response_format = form.get("response_format", "json")
    if response_format in ("text", "srt", "vtt"):
        return web.Response(text=text, content_type="text/plain")
    payload: dict[str, object] = {"text": text}
    if response_format == "verbose_json":
        payload.update(task="transcribe", language="en", duration=0.0, segments=[])
    return demo.reply(got, payload)


def _silence_wav(samples: int) -> bytes:
    data_size = samples * 2
    header = struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF", 36 + data_size, b"WAVE",
        b"fmt ", 16, 1, 1, _SAMPLE_RATE, _SAMPLE_RATE * 2, 2, 16,
        b"data", data_size,
    )  # fmt: skip
    return header + bytes(data_size)


async def speech(demo: Demo, request: web.Request) -> web.StreamResponse:
    got = await received(request)
    body = json_object(got)
    text = string_field(body, "input")
    # A tenth of a second per character, at most ten seconds: big enough to notice, small enough to stay fast.
    samples = min(10 * _SAMPLE_RATE, max(1, len(text)) * _SAMPLE_RATE // 10)
    return web.Response(body=_silence_wav(samples), content_type="audio/wav")


def _images(demo: Demo, body: Mapping[str, object], revised_prompt: str) -> dict[str, object]:
    count = body.get("n", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 10:
        raise BadRequest(f"n must be an integer from 1 to 10, got {count!r}")
    if body.get("response_format") == "url":
        image = {"url": f"data:image/png;base64,{_PNG_1X1}"}
    else:
        image = {"b64_json": _PNG_1X1}
    return {"created": created(), "data": [{**image, "revised_prompt": revised_prompt} for _ in range(count)]}


async def image_generations(demo: Demo, request: web.Request) -> web.StreamResponse:
    got = await received(request)
    body = json_object(got)
    prompt = string_field(body, "prompt")
    return demo.reply(got, _images(demo, body, f"demo {demo.name} drew: {prompt}"))


async def image_edits(demo: Demo, request: web.Request) -> web.StreamResponse:
    got = await received(request)
    form = _form(got)
    image = _file_field(form, "image", "image[]")
    prompt = string_field(form, "prompt")
    count = form.get("n", "1")
    fields = {**form, "n": int(count) if isinstance(count, str) and count.isdigit() else count}
    revised = f"demo {demo.name} edited {image['size']} bytes of {image['filename']}: {prompt}"
    return demo.reply(got, _images(demo, fields, revised))


async def voices(demo: Demo, request: web.Request) -> web.StreamResponse:
    got = await received(request)
    names = ["demo-alto", "demo-bass", "demo-tenor"]
    return demo.reply(got, {"model": got.model or demo.name, "voices": names})
