"""Pure parts of forwarding: upstream URLs and the bodies sent after a rewrite."""

from __future__ import annotations

import json

from llmswap.config.model import ModelConfig
from llmswap.server.inference.proxy import upstream_url
from llmswap.server.inference.resolve import identify
from llmswap.server.inference.routes import outgoing_body
from llmswap.upstream.filters import FilterPlan, local_plan


def test_upstream_url_keeps_the_base_path_and_the_raw_query() -> None:
    assert str(upstream_url("http://127.0.0.1:5800", "/v1/chat/completions", "")) == (
        "http://127.0.0.1:5800/v1/chat/completions"
    )
    assert str(upstream_url("https://openrouter.ai/api/", "/v1/models", "a=1&b=%2F")) == (
        "https://openrouter.ai/api/v1/models?a=1&b=%2F"
    )
    assert str(upstream_url("http://h:1", "some%20path", "")) == "http://h:1/some%20path"


def body_bytes(body: object) -> bytes:
    assert isinstance(body, bytes | bytearray)
    return bytes(body)


def test_json_body_is_sent_untouched_without_filters() -> None:
    raw = bytearray(b'{ "model" : "a",\n "x": 1.50 }')
    found = identify("POST", "application/json", raw, {})
    assert outgoing_body(raw, found, FilterPlan()) is raw
    # A plan that changes nothing keeps the client's bytes too.
    assert outgoing_body(raw, found, FilterPlan(model="a")) is raw


def test_json_body_is_reserialized_when_filtered() -> None:
    raw = bytearray('{"model": "alias", "prompt": "żółw"}'.encode())
    found = identify("POST", "application/json", raw, {})
    model = ModelConfig(id="m", cmd=("x",), use_model_name="upstream-name")
    sent = body_bytes(outgoing_body(raw, found, local_plan(model, "alias")))
    assert json.loads(sent) == {"model": "upstream-name", "prompt": "żółw"}
    assert "żółw".encode() in sent  # not \\u-escaped: the body stays compact


def test_multipart_rename_splices_only_the_model_value() -> None:
    audio = bytes(range(256)) * 16
    raw = bytearray(
        b'--B\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n' + audio + b"\r\n"
        b'--B\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-alias\r\n--B--\r\n'
    )
    found = identify("POST", "multipart/form-data; boundary=B", raw, {})
    body = outgoing_body(raw, found, FilterPlan(model="whisper-large-v3"))
    assert body_bytes(body) == bytes(raw).replace(b"whisper-alias", b"whisper-large-v3")


def test_urlencoded_rename_is_percent_encoded() -> None:
    raw = bytearray(b"model=a&prompt=x")
    found = identify("POST", "application/x-www-form-urlencoded", raw, {})
    assert body_bytes(outgoing_body(raw, found, FilterPlan(model="org/model v2"))) == (
        b"model=org%2Fmodel+v2&prompt=x"
    )
