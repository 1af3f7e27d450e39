"""Guardrails before the queue: a prompt that cannot fit its model's context is refused before it waits.

The limit (OC-CORE-1020, seed 003) is, in this order: the model's `capabilities.context`; a context
length in its `metadata` (`context_length`, `contextLength`, `n_ctx`, `ctx_size` or `context`); what
its upstream reported once loaded (llama-server's `GET /props` → `default_generation_settings.n_ctx`,
read once per model and command line after its first granted request, and remembered). Without any
of these nothing is checked.

The prompt is estimated conservatively, so that no prompt that fits is ever refused: token ids
(`prompt: [1, 2, ...]`) count one each; text counts one token per `BYTES_PER_TOKEN` bytes of UTF-8
(`messages[].content` and its text parts, `system`, `prompt`, `input`). Tokenizers average about four
bytes per token on English text and code, so the estimate is about half the real count: only a
prompt about twice over the limit is refused here, with an error naming both numbers, and no model
is loaded for it. Anything subtler is left to the upstream, which knows its tokenizer. Chat templates
and roles add tokens, which the estimate leaves out for the same reason.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from llmswap.config.model import ModelConfig
from llmswap.upstream.client import Upstream
from llmswap.upstream.forward import Buffer, Unreachable, forward

log = logging.getLogger("llmswap.guardrails")

BYTES_PER_TOKEN = 8  # twice the ~4 of English text: the estimate stays below the real count
METADATA_KEYS = ("context_length", "contextLength", "n_ctx", "ctx_size", "context")
PROPS_TIMEOUT = 2.0  # seconds for the one /props read per model and command line
PROPS_LIMIT = 1024 * 1024  # bytes of /props read at most (llama-server's is a few KiB)


@dataclass(frozen=True)
class ContextLimit:
    tokens: int
    source: str  # where the number came from, for the error message


@dataclass(frozen=True)
class PromptEstimate:
    tokens: int  # at most the real count
    text_bytes: int
    token_ids: int


# Per (model id, command line): the n_ctx its upstream reported, None when it reported none.
REPORTED: web.AppKey[dict[tuple[str, str], int | None]] = web.AppKey("llmswap_reported_context", dict)


def declared_limit(model: ModelConfig) -> ContextLimit | None:
    """The context the config declares for `model`, if any (a field and a few metadata keys: read per
    request, as cheap as a lookup in a cache would be)."""
    if model.capabilities is not None and model.capabilities.context > 0:
        return ContextLimit(model.capabilities.context, "its capabilities.context")
    for key in METADATA_KEYS:
        value = model.metadata.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return ContextLimit(value, f"its metadata.{key}")
    return None


def context_limit(app: web.Application, model: ModelConfig) -> ContextLimit | None:
    declared = declared_limit(model)
    if declared is not None:
        return declared
    reported = app[REPORTED].get((model.id, model.cmd_text))
    return ContextLimit(reported, "n_ctx its server reported") if reported else None


def estimate_prompt(document: Mapping[str, Any] | None) -> PromptEstimate:
    """A lower bound on the prompt's tokens in an OpenAI or Anthropic request body."""
    counts = [0, 0]  # text bytes, token ids

    def add(value: Any) -> None:
        if isinstance(value, str):
            counts[0] += len(value.encode("utf-8", "surrogatepass"))
        elif isinstance(value, int) and not isinstance(value, bool):
            counts[1] += 1
        elif isinstance(value, list):
            for item in value:
                add(item)
        elif isinstance(value, dict) and value.get("type") in (None, "text", "input_text"):
            add(value.get("text"))
            add(value.get("content"))

    if document:
        for key in ("system", "prompt", "input"):
            add(document.get(key))
        messages = document.get("messages")
        if isinstance(messages, list):
            for message in messages:
                if isinstance(message, dict):
                    add(message.get("content"))
    text_bytes, token_ids = counts
    return PromptEstimate(token_ids + text_bytes // BYTES_PER_TOKEN, text_bytes, token_ids)


def over_context(app: web.Application, model: ModelConfig,
                 document: Mapping[str, Any] | None) -> str | None:
    """The refusal message when the prompt certainly does not fit `model`'s context; None otherwise."""
    limit = context_limit(app, model)
    if limit is None or not document:
        return None
    estimate = estimate_prompt(document)
    if estimate.tokens <= limit.tokens:
        return None
    how = (f"{estimate.text_bytes} bytes of text at most one token per {BYTES_PER_TOKEN} bytes"
           + (f" plus {estimate.token_ids} token ids" if estimate.token_ids else ""))
    return (f"This request's prompt is at least {estimate.tokens} tokens ({how}), more than the "
            f"{limit.tokens}-token context of model {model.id} ({limit.source}); shorten the prompt or "
            f"use a model with a longer context")


async def learn_reported_context(app: web.Application, model: ModelConfig,
                                 upstream: Upstream) -> None:
    """Read the upstream's n_ctx once per model and command line (llama-server's GET /props)."""
    key = (model.id, model.cmd_text)
    reported = app[REPORTED]
    if key in reported or declared_limit(model) is not None:
        return
    reported[key] = None  # one try: an upstream without /props is not asked again
    answer = Buffer(limit=PROPS_LIMIT)
    try:
        async with asyncio.timeout(PROPS_TIMEOUT):
            url = URL(f"{model.proxy.rstrip('/')}/props")
            await forward(upstream, "GET", url, CIMultiDict(), None, answer)
        if answer.status != 200 or answer.failure is not None or answer.truncated:
            return
        props = json.loads(answer.body)
    except (Unreachable, TimeoutError, ValueError) as exc:
        log.debug("%s: no context length from /props (%s)", model.id, exc)
        return
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0 and math.isfinite(n_ctx):
        reported[key] = n_ctx
        log.info("%s: its server reports a context of %d tokens; longer prompts are refused", model.id, n_ctx)
