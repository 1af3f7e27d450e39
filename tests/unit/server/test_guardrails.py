"""The context guardrail's arithmetic: where a model's limit comes from and how prompts are estimated."""

from __future__ import annotations

from aiohttp import web

from llmswap.config.model import Capabilities, ModelConfig
from llmswap.server.inference.guardrails import (
    BYTES_PER_TOKEN,
    REPORTED,
    context_limit,
    declared_limit,
    estimate_prompt,
    over_context,
)


def model(**overrides) -> ModelConfig:
    return ModelConfig(**{"id": "m", "cmd": ("srv",), "cmd_text": "srv", **overrides})


def app() -> web.Application:
    application = web.Application()
    application[REPORTED] = {}
    return application


def test_capabilities_context_comes_before_metadata():
    limit = declared_limit(model(capabilities=Capabilities(context=4096), metadata={"n_ctx": 99}))
    assert (limit.tokens, limit.source) == (4096, "its capabilities.context")


def test_a_metadata_context_length_is_a_limit():
    limit = declared_limit(model(metadata={"family": "qwen", "context_length": 8192}))
    assert (limit.tokens, limit.source) == (8192, "its metadata.context_length")


def test_no_declared_context_and_nothing_reported_checks_nothing():
    a = app()
    m = model()
    assert context_limit(a, m) is None
    assert over_context(a, m, {"prompt": "x" * 10_000_000}) is None


def test_a_reported_context_counts_for_the_same_command_line_only():
    a = app()
    a[REPORTED][("m", "srv")] = 512
    assert context_limit(a, model()).tokens == 512
    assert context_limit(a, model(cmd_text="srv --ctx-size 4096")) is None


def test_text_counts_one_token_per_eight_bytes_and_token_ids_one_each():
    document = {
        "system": "s" * 16,
        "messages": [
            {"role": "user", "content": "a" * 80},
            {"role": "user", "content": [
                {"type": "text", "text": "b" * 8},
                {"type": "image_url", "image_url": {"url": "data:" + "z" * 1000}},
            ]},
        ],
    }
    estimate = estimate_prompt(document)
    assert estimate.text_bytes == 104 and estimate.tokens == 104 // BYTES_PER_TOKEN
    assert estimate_prompt({"prompt": [1, 2, 3, 4]}).tokens == 4
    assert estimate_prompt({"input": ["é" * 8]}).text_bytes == 16  # UTF-8 bytes, not characters


def test_a_prompt_over_the_limit_is_refused_naming_both_numbers():
    m = model(capabilities=Capabilities(context=100))
    message = over_context(app(), m, {"messages": [{"role": "user", "content": "x" * 1608}]})
    assert message is not None
    assert "at least 201 tokens" in message and "100-token context of model m" in message
    assert "capabilities.context" in message and "shorten the prompt" in message


def test_a_prompt_at_the_limit_passes():
    m = model(capabilities=Capabilities(context=100))
    assert over_context(app(), m, {"messages": [{"role": "user", "content": "x" * 800}]}) is None
