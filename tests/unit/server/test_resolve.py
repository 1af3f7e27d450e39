"""Finding the model a request names: JSON, forms, multipart, the query, bodies that lie about their type."""

from __future__ import annotations

import json

import pytest

from llmswap.config.model import Config, ModelConfig, PeerConfig, SelectorConfig
from llmswap.server.inference.resolve import (
    MalformedRequest,
    identify,
    multipart_parts,
    renamed,
    unknown_model_message,
)

JSON = "application/json"


def multipart(boundary: str, *parts: tuple[str, str | None, bytes]) -> bytes:
    out = b""
    for name, filename, content in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n".encode()
        if filename:
            out += b"Content-Type: application/octet-stream\r\n"
        out += b"\r\n" + content + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def test_json_body_names_the_model_and_the_stream_flag() -> None:
    found = identify("POST", JSON, b'{"model": "qwen", "stream": true}', {})
    assert (found.model, found.streaming, found.source) == ("qwen", True, "json")
    assert found.document == {"model": "qwen", "stream": True}


def test_json_content_type_with_parameters_and_suffix() -> None:
    assert identify("POST", "application/json; charset=utf-8", b'{"model":"a"}', {}).model == "a"
    assert identify("POST", "application/vnd.llm+json", b'{"model":"b"}', {}).model == "b"


def test_stream_must_be_the_boolean_true() -> None:
    assert not identify("POST", JSON, b'{"model":"a","stream":"true"}', {}).streaming


def test_invalid_json_with_a_json_type_is_malformed() -> None:
    with pytest.raises(MalformedRequest, match="not valid JSON"):
        identify("POST", JSON, b'{"model": ', {})
    with pytest.raises(MalformedRequest, match="UTF-8"):
        identify("POST", JSON, b'{"model": "\xff"}', {})


def test_model_that_is_not_a_string_is_malformed() -> None:
    with pytest.raises(MalformedRequest, match="model must be a string"):
        identify("POST", JSON, b'{"model": 5}', {})


def test_json_that_is_not_an_object_names_no_model() -> None:
    assert identify("POST", JSON, b"[1, 2]", {}).model == ""
    assert identify("POST", JSON, b"", {}).model == ""


def test_json_object_without_a_json_content_type_is_read_as_json() -> None:
    for content_type in ("", "text/plain", "application/x-www-form-urlencoded"):
        found = identify("POST", content_type, b' {"model": "a", "stream": true}', {})
        assert (found.model, found.streaming, found.source) == ("a", True, "json")


def test_non_json_body_without_a_type_names_no_model() -> None:
    assert identify("POST", "text/plain", b"{not json", {}).model == ""
    assert identify("POST", "", b"hello", {}).model == ""


def test_urlencoded_form_and_model_span() -> None:
    body = b"prompt=hi+there&model=my%2Fmodel&stream=true"
    found = identify("POST", "application/x-www-form-urlencoded", body, {})
    assert (found.model, found.streaming, found.source) == ("my/model", True, "form")
    assert found.model_span is not None
    assert body[found.model_span.start : found.model_span.end] == b"my%2Fmodel"


def test_multipart_model_after_a_file_part() -> None:
    audio = bytes(range(256)) * 64 + b"\r\n--notquite"
    body = multipart("XyZ", ("file", "a.wav", audio), ("model", None, b"whisper"), ("stream", None, b"true"))
    found = identify("POST", "multipart/form-data; boundary=XyZ", body, {})
    assert (found.model, found.streaming, found.source) == ("whisper", True, "multipart")
    assert found.boundary == "XyZ"
    assert found.model_span is not None
    assert body[found.model_span.start : found.model_span.end] == b"whisper"


def test_multipart_parts_locate_file_content_without_copying() -> None:
    audio = b"\x00\x01binary\r\nstill binary"
    body = multipart("b0und", ("model", None, b"m"), ("file", "clip.wav", audio))
    parts = list(multipart_parts(body, "b0und"))
    assert [(p.name, p.filename) for p in parts] == [("model", None), ("file", "clip.wav")]
    assert body[parts[1].content.start : parts[1].content.end] == audio


def test_quoted_boundary_and_escaped_filename() -> None:
    body = (
        b'--a b\r\nContent-Disposition: form-data; name="model"\r\n\r\nm\r\n'
        b'--a b\r\ncontent-disposition: form-data; name="f"; filename="x \\"y\\".txt"\r\n'
        b"\r\nzz\r\n--a b--\r\n"
    )
    found = identify("POST", 'multipart/form-data; boundary="a b"', body, {})
    assert found.model == "m"
    assert [p.filename for p in multipart_parts(body, "a b")] == [None, 'x "y".txt']


def test_multipart_without_boundary_or_truncated_is_malformed() -> None:
    with pytest.raises(MalformedRequest, match="no boundary"):
        identify("POST", "multipart/form-data", b"--x\r\n", {})
    with pytest.raises(MalformedRequest, match="truncated"):
        truncated = b'--x\r\nContent-Disposition: form-data; name="model"\r\n\r\nm'
        identify("POST", "multipart/form-data; boundary=x", truncated, {})
    with pytest.raises(MalformedRequest, match="does not contain"):
        identify("POST", "multipart/form-data; boundary=x", b"garbage", {})


def test_get_uses_the_query() -> None:
    found = identify("GET", "", b"", {"model": "a", "stream": "true"})
    assert (found.model, found.streaming, found.source) == ("a", True, "query")
    assert identify("GET", "", b"", {}).model == ""


def test_query_is_a_fallback_for_bodies_without_a_model() -> None:
    found = identify("POST", JSON, json.dumps({"input": "x"}).encode(), {"model": "q"})
    assert (found.model, found.source) == ("q", "query")
    assert found.document == {"input": "x"}
    assert identify("POST", JSON, b'{"model": "body"}', {"model": "q"}).model == "body"


# -------------------------------------------------------------------------------- renaming (pins, selectors)


def test_renamed_json_names_the_new_model_and_keeps_the_rest() -> None:
    raw = bytearray(b'{"model": "sel", "messages": [], "stream": true}')
    found, body = renamed(identify("POST", JSON, raw, {}), raw, "qwen")
    assert json.loads(body) == {"model": "qwen", "messages": [], "stream": True}
    assert (found.model, found.document, found.streaming) == ("qwen", json.loads(body), True)


def test_renamed_multipart_splices_the_field_and_leaves_the_file_alone() -> None:
    raw = bytearray(multipart("xyz", ("file", "a.wav", b"RIFF" + bytes(64)), ("model", None, b"sel")))
    form = "multipart/form-data; boundary=xyz"
    found, body = renamed(identify("POST", form, raw, {}), raw, "whisper-large")
    assert bytes(body) == bytes(raw).replace(b"\r\n\r\nsel\r\n", b"\r\n\r\nwhisper-large\r\n")
    again = identify("POST", form, body, {})
    assert again.model == found.model == "whisper-large" and again.model_span == found.model_span


def test_renamed_urlencoded_encodes_the_new_name() -> None:
    raw = bytearray(b"a=1&model=sel&b=2")
    found, body = renamed(identify("POST", "application/x-www-form-urlencoded", raw, {}), raw, "org/m 1")
    assert bytes(body) == b"a=1&model=org%2Fm+1&b=2" and found.model == "org/m 1"


def test_renamed_query_leaves_the_body_to_the_caller() -> None:
    found, body = renamed(identify("GET", "", b"", {"model": "sel"}), bytearray(), "qwen")
    assert (found.model, found.source, bytes(body)) == ("qwen", "query", b"")


def test_an_unknown_model_is_named_and_what_may_be_asked_for_is_listed() -> None:
    models = {m: ModelConfig(id=m, cmd=("serve",), aliases=(f"{m}-alias",) if m == "m03" else ())
              for m in (f"m{i:02d}" for i in range(25))}
    models["hidden"] = ModelConfig(id="hidden", cmd=("serve",), unlisted=True)
    config = Config(models=models, aliases={"m03-alias": "m03"},
                    selectors={"fast": SelectorConfig(id="fast", strategy="warm", targets=("m01",))},
                    peers={"p": PeerConfig(id="p", proxy="http://127.0.0.1:1", models=("remote",))})
    message = unknown_model_message(config, "gpt-9")
    assert message.startswith(
        "no router for requested model 'gpt-9': available are fast, m00, m01, m02, m03, m03-alias, m04,")
    assert "hidden" not in message and "remote" not in message  # the first 20 in order are shown
    # 28 names: 25 listed models, an alias, a selector and a peer's model.
    assert message.endswith(" m17 and 8 more (GET /v1/models lists them)")
    assert unknown_model_message(Config(), "x") == "no router for requested model 'x': no model is configured"
    small = Config(models={"m": ModelConfig(id="m", cmd=("serve",))}, aliases={"chat": "m"})
    assert unknown_model_message(small, "x") == "no router for requested model 'x': available are chat, m"
