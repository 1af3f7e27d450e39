"""The loading commentary's shapes: each API family gets events its clients parse."""

from __future__ import annotations

import json

from llmswap.server.inference.loading import (
    ANTHROPIC,
    CHAT,
    COMPLETION,
    GENERIC,
    LLAMACPP,
    anthropic_sse_error,
    comment,
    dialect_for,
    pieces,
)
from llmswap.server.inference.proxy import openai_sse_error
from tests.helpers.sse import parse_events


def test_each_route_family_has_its_dialect() -> None:
    assert dialect_for("/v1/chat/completions") is CHAT
    assert dialect_for("/v/chat/completions") is CHAT
    assert dialect_for("/v1/completions") is COMPLETION
    assert dialect_for("/completion") is LLAMACPP
    assert dialect_for("/infill") is LLAMACPP
    assert dialect_for("/v1/messages") is ANTHROPIC
    assert dialect_for("/v1/responses") is GENERIC
    assert dialect_for("/v1/audio/speech") is GENERIC


def test_chat_commentary_is_a_reasoning_content_delta() -> None:
    [event] = parse_events(CHAT.text("alias", "Done!\n").decode())
    chunk = event.json()
    assert chunk["object"] == "chat.completion.chunk" and chunk["model"] == "alias"
    delta = {"reasoning_content": "Done!\n"}
    assert chunk["choices"] == [{"index": 0, "delta": delta, "finish_reason": None}]


def test_completion_commentary_keeps_the_text_empty() -> None:
    [choice] = parse_events(COMPLETION.text("m", "...").decode())[0].json()["choices"]
    assert choice["text"] == "" and choice["reasoning_content"] == "..."
    native = parse_events(LLAMACPP.text("m", "...").decode())[0].json()
    assert native == {"content": "", "reasoning_content": "...", "stop": False}


def test_anthropic_commentary_is_invisible_to_parsers_and_ticks_are_pings() -> None:
    assert parse_events(ANTHROPIC.text("m", "loading\nmodel").decode()) == []
    [ping] = parse_events(ANTHROPIC.tick().decode())
    assert ping.name == "ping" and ping.json() == {"type": "ping"}
    assert CHAT.tick() == b""


def test_comments_put_every_line_behind_a_colon() -> None:
    assert comment("a\nb") == b": a\n: b\n\n"


def test_error_events() -> None:
    [error] = parse_events(anthropic_sse_error(500, "health check timed out").decode())
    assert error.name == "error"
    assert error.json()["error"] == {"type": "api_error", "message": "health check timed out"}
    events = parse_events(openai_sse_error(502, "boom").decode())
    assert json.loads(events[0].data)["error"]["code"] == "bad_gateway"
    assert events[1].data == "[DONE]"


def test_pieces_never_split_a_character() -> None:
    assert pieces("━━━━━━━") == ["━━━━━", "━━"]
    assert pieces("") == [""]
