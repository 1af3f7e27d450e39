"""The Anthropic Messages routes: /v1/messages (whole or streamed as Anthropic's SSE events) and
/v1/messages/count_tokens."""

from collections.abc import Mapping
from contextlib import aclosing
from functools import partial

from aiohttp import web

from llmswap.demo.context import Demo, is_streaming, json_object, requested_model, token_limit
from llmswap.demo.received import received
from llmswap.demo.replies import BadRequest, EventStream
from llmswap.demo.text import count_tokens, text_of


def _prompt(body: Mapping[str, object]) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise BadRequest("messages is required: a list of {role, content} objects")
    return text_of([body.get("system"), messages])


async def messages(demo: Demo, request: web.Request) -> web.StreamResponse:
    got = await received(request)
    body = json_object(got)
    prompt = _prompt(body)
    limit = token_limit(body, "max_tokens")
    tokens = demo.answer(prompt, limit)
    stop_reason = "max_tokens" if limit.requested else "end_turn"
    message: dict[str, object] = {
        "id": demo.next_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": requested_model(demo, body),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": count_tokens(prompt), "output_tokens": 0},
    }
    if not is_streaming(body):
        text = await demo.generate_all(tokens)
        whole = {
            **message,
            "content": [{"type": "text", "text": text}],
            "stop_reason": stop_reason,
            "usage": {"input_tokens": count_tokens(prompt), "output_tokens": len(tokens)},
        }
        return demo.reply(got, whole)

    stream = await EventStream.open(request)
    start = {"type": "message_start", "message": message}
    await stream.send(demo.with_echo(got, start), event="message_start")
    block_start = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    await stream.send(block_start, event="content_block_start")
    await stream.send({"type": "ping"}, event="ping")
    async with aclosing(demo.generate(tokens)) as generation:
        async for token in generation:
            text_delta = {"type": "text_delta", "text": token}
            delta = {"type": "content_block_delta", "index": 0, "delta": text_delta}
            await stream.send(delta, event="content_block_delta")
    await stream.send({"type": "content_block_stop", "index": 0}, event="content_block_stop")
    message_delta = {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": {"output_tokens": len(tokens)},
    }
    await stream.send(message_delta, event="message_delta")
    await stream.send({"type": "message_stop"}, event="message_stop")
    return await stream.close()


async def count_message_tokens(demo: Demo, request: web.Request) -> web.StreamResponse:
    got = await received(request)
    return demo.reply(got, {"input_tokens": count_tokens(_prompt(json_object(got)))})


def routes(demo: Demo) -> list[web.RouteDef]:
    return [
        web.post("/v1/messages", partial(messages, demo)),
        web.post("/v1/messages/count_tokens", partial(count_message_tokens, demo)),
    ]
