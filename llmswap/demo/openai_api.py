"""The OpenAI-compatible routes: models, chat and text completions (llama.cpp's /completion and /infill
answer like /v1/completions), embeddings, rerank and a minimal Responses API; `routes` lists them all,
with the audio and image routes of `llmswap.demo.media_api`."""

import base64
import struct
from collections.abc import Awaitable, Callable, Mapping
from contextlib import aclosing
from functools import partial

from aiohttp import web

from llmswap.demo.context import (
    Demo,
    TokenLimit,
    created,
    is_streaming,
    json_object,
    requested_model,
    string_field,
    token_limit,
)
from llmswap.demo.media_api import image_edits, image_generations, speech, transcriptions, voices
from llmswap.demo.received import Received, received
from llmswap.demo.replies import BadRequest, EventStream
from llmswap.demo.text import DEFAULT_EMBEDDING_DIMENSIONS, count_tokens, embedding, relevance_scores, text_of
from llmswap.demo.usage import Stopwatch, usage

Handler = Callable[[Demo, web.Request], Awaitable[web.StreamResponse]]

_MAX_EMBEDDING_DIMENSIONS = 4096


def finish_reason(limit: TokenLimit) -> str:
    return "length" if limit.requested else "stop"


async def list_models(demo: Demo, request: web.Request) -> web.StreamResponse:
    got = await received(request)
    model = {"id": demo.name, "object": "model", "created": 0, "owned_by": "llmswap-demo"}
    return demo.reply(got, {"object": "list", "data": [model]})


async def chat_completions(demo: Demo, request: web.Request) -> web.StreamResponse:
    clock = Stopwatch()
    got = await received(request)
    body = json_object(got)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise BadRequest("messages is required: a list of {role, content} objects")
    prompt = text_of(messages)
    limit = token_limit(body, "max_completion_tokens", "max_tokens")
    tokens = demo.answer(prompt, limit)
    header = {
        "id": demo.next_id("chatcmpl"),
        "created": created(),
        "model": requested_model(demo, body),
        "system_fingerprint": "llmswap-demo",
    }
    await demo.process_prompt(prompt)
    if not is_streaming(body):
        clock.generating()
        text = await demo.generate_all(tokens)
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason(limit),
        }
        whole = {"object": "chat.completion", **header, "choices": [choice], "usage": usage(prompt, tokens)}
        return demo.reply(got, {**whole, "timings": clock.timings(prompt, tokens)})

    def chunk(delta: dict[str, str], finish: str | None = None) -> dict[str, object]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"object": "chat.completion.chunk", **header, "choices": [choice]}

    stream = await EventStream.open(request)
    await stream.send(demo.with_echo(got, chunk({"role": "assistant", "content": ""})))
    clock.generating()
    async with aclosing(demo.generate(tokens)) as generation:
        async for token in generation:
            await stream.send(chunk({"content": token}))
    await stream.send({**chunk({}, finish_reason(limit)), "timings": clock.timings(prompt, tokens)})
    if _include_usage(body):
        await stream.send(
            {"object": "chat.completion.chunk", **header, "choices": [], "usage": usage(prompt, tokens)}
        )
    await stream.send("[DONE]")
    return await stream.close()


def _include_usage(body: Mapping[str, object]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _completion_prompt(got: Received, body: Mapping[str, object]) -> str:
    if got.path == "/infill":
        parts = (body.get("input_prefix"), body.get("prompt"), body.get("input_suffix"))
        return "\n".join(text_of(part) for part in parts if part)
    if got.path == "/v1/completions" and "prompt" not in body:
        raise BadRequest("prompt is required: a string or a list of strings")
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str | list):
        raise BadRequest(f"prompt must be a string or a list of strings, got {prompt!r}")
    return text_of(prompt)


async def completions(demo: Demo, request: web.Request) -> web.StreamResponse:
    clock = Stopwatch()
    got = await received(request)
    body = json_object(got)
    prompt = _completion_prompt(got, body)
    limit = token_limit(body, "max_tokens", "n_predict")
    tokens = demo.answer(prompt, limit)
    header = {
        "id": demo.next_id("cmpl"),
        "object": "text_completion",
        "created": created(),
        "model": requested_model(demo, body),
        "system_fingerprint": "llmswap-demo",
    }
    if not is_streaming(body):
        clock.generating()
        text = await demo.generate_all(tokens)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason(limit)}
        whole = {**header, "choices": [choice], "usage": usage(prompt, tokens)}
        return demo.reply(got, {**whole, "timings": clock.timings(prompt, tokens)})

    def chunk(text: str, finish: str | None = None) -> dict[str, object]:
        return {**header, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}

    stream = await EventStream.open(request)
    echo_pending = True

    async def send(text: str, finish: str | None = None) -> None:
        nonlocal echo_pending
        event = chunk(text, finish)
        await stream.send(demo.with_echo(got, event) if echo_pending else event)
        echo_pending = False

    clock.generating()
    async with aclosing(demo.generate(tokens)) as generation:
        async for token in generation:
            await send(token)
    final = {**chunk("", finish_reason(limit)), "timings": clock.timings(prompt, tokens)}
    await stream.send(demo.with_echo(got, final) if echo_pending else final)
    if _include_usage(body):
        await stream.send({**header, "choices": [], "usage": usage(prompt, tokens)})
    await stream.send("[DONE]")
    return await stream.close()


def _embedding_inputs(body: Mapping[str, object]) -> list[str]:
    value = body.get("input")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(item, int) for item in value):
            return [" ".join(map(str, value))]  # one input given as token ids
        inputs: list[str] = []
        for item in value:
            if isinstance(item, str):
                inputs.append(item)
            elif isinstance(item, list) and all(isinstance(token, int) for token in item):
                inputs.append(" ".join(map(str, item)))
            else:
                break
        else:
            return inputs
    raise BadRequest(f"input must be a string, a list of strings or a list of token-id lists, got {value!r}")


async def embeddings(demo: Demo, request: web.Request) -> web.StreamResponse:
    got = await received(request)
    body = json_object(got)
    inputs = _embedding_inputs(body)
    dimensions = body.get("dimensions", DEFAULT_EMBEDDING_DIMENSIONS)
    if isinstance(dimensions, bool) or not isinstance(dimensions, int):
        raise BadRequest(f"dimensions must be an integer, got {dimensions!r}")
    if not 1 <= dimensions <= _MAX_EMBEDDING_DIMENSIONS:
        raise BadRequest(f"dimensions must be from 1 to {_MAX_EMBEDDING_DIMENSIONS}, got {dimensions}")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise BadRequest(f"encoding_format must be 'float' or 'base64', got {encoding!r}")
    data: list[dict[str, object]] = []
    for index, text in enumerate(inputs):
        vector = embedding(demo.name, text, dimensions)
        encoded: object = vector
        if encoding == "base64":
            encoded = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    tokens = sum(count_tokens(text) for text in inputs)
    return demo.reply(
        got,
        {
            "object": "list",
            "data": data,
            "model": requested_model(demo, body),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        },
    )


def _documents(body: Mapping[str, object]) -> list[str]:
    value = body.get("documents")
    if isinstance(value, list):
        documents = [item.get("text") if isinstance(item, dict) else item for item in value]
        if all(isinstance(document, str) for document in documents):
            return documents  # type: ignore[return-value]
    raise BadRequest(f"documents must be a list of strings or {{text}} objects, got {value!r}")


async def rerank(demo: Demo, request: web.Request) -> web.StreamResponse:
    got = await received(request)
    body = json_object(got)
    query = string_field(body, "query")
    documents = _documents(body)
    top_n = body.get("top_n", len(documents))
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0:
        raise BadRequest(f"top_n must be an integer >= 0, got {top_n!r}")
    scores = relevance_scores(demo.name, query, documents)
    ranked = sorted(range(len(documents)), key=lambda index: (-scores[index], index))[:top_n]
    results: list[dict[str, object]] = []
    for index in ranked:
        result: dict[str, object] = {"index": index, "relevance_score": scores[index]}
        if body.get("return_documents") is True:
            result["document"] = {"text": documents[index]}
        results.append(result)
    tokens = count_tokens(query) + sum(count_tokens(document) for document in documents)
    return demo.reply(
        got,
        {
            "id": demo.next_id("rerank"),
            "object": "list",
            "model": requested_model(demo, body),
            "results": results,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        },
    )


async def responses(demo: Demo, request: web.Request) -> web.StreamResponse:
    got = await received(request)
    body = json_object(got)
    if "input" not in body:
        raise BadRequest("input is required: a string or a list of input items")
    prompt = text_of([body.get("instructions"), body.get("input")])
    limit = token_limit(body, "max_output_tokens")
    tokens = demo.answer(prompt, limit)
    response_id, message_id = demo.next_id("resp"), demo.next_id("msg")

    def response(status: str, text: str | None) -> dict[str, object]:
        output = [] if text is None else [_response_message(message_id, text)]
        return {
            "id": response_id,
            "object": "response",
            "created_at": created(),
            "status": status,
            "model": requested_model(demo, body),
            "output": output,
            "usage": {
                "input_tokens": count_tokens(prompt),
                "output_tokens": len(tokens),
                "total_tokens": count_tokens(prompt) + len(tokens),
            },
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }

    if not is_streaming(body):
        return demo.reply(got, response("completed", await demo.generate_all(tokens)))

    stream = await EventStream.open(request)
    sequence = 0

    async def send(kind: str, **fields: object) -> None:
        nonlocal sequence
        event = {"type": kind, "sequence_number": sequence, **fields}
        await stream.send(demo.with_echo(got, event) if sequence == 0 else event, event=kind)
        sequence += 1

    place = {"item_id": message_id, "output_index": 0, "content_index": 0}
    await send("response.created", response={**response("in_progress", None)})
    item = {**_response_message(message_id, ""), "status": "in_progress", "content": []}
    await send("response.output_item.added", output_index=0, item=item)
    await send("response.content_part.added", **place, part=_output_text(""))
    parts: list[str] = []
    async with aclosing(demo.generate(tokens)) as generation:
        async for token in generation:
            parts.append(token)
            await send("response.output_text.delta", **place, delta=token, logprobs=[])
    text = "".join(parts)
    await send("response.output_text.done", **place, text=text, logprobs=[])
    await send("response.content_part.done", **place, part=_output_text(text))
    await send("response.output_item.done", output_index=0, item=_response_message(message_id, text))
    await send("response.completed", response=response("completed", text))
    return await stream.close()


def _output_text(text: str) -> dict[str, object]:
    return {"type": "output_text", "text": text, "annotations": []}


def _response_message(message_id: str, text: str) -> dict[str, object]:
    return {
        "type": "message",
        "id": message_id,
        "status": "completed",
        "role": "assistant",
        "content": [_output_text(text)],
    }


def routes(demo: Demo) -> list[web.RouteDef]:
    posts: dict[str, Handler] = {
        "/v1/chat/completions": chat_completions,
        "/v1/completions": completions,
        "/completion": completions,
        "/infill": completions,
        "/v1/embeddings": embeddings,
        "/v1/rerank": rerank,
        "/v1/reranking": rerank,
        "/rerank": rerank,
        "/v1/audio/transcriptions": transcriptions,
        "/v1/audio/speech": speech,
        "/v1/images/generations": image_generations,
        "/v1/images/edits": image_edits,
        "/v1/responses": responses,
    }
    gets: dict[str, Handler] = {"/v1/models": list_models, "/v1/audio/voices": voices}
    return [web.post(path, partial(handler, demo)) for path, handler in posts.items()] + [
        web.get(path, partial(handler, demo)) for path, handler in gets.items()
    ]
