"""A model's `capabilities:` (llama-swap's), shown in `/v1/models`."""

from __future__ import annotations

from llmswap.config import keys
from llmswap.config.fields import Fields
from llmswap.config.model import Capabilities

MODALITIES = ("text", "audio", "image")
CAPABILITY_KEYS = keys.CAPABILITIES  # the keys the loader accepts here (llmswap.config.keys)


def read_capabilities(fields: Fields) -> Capabilities | None:
    caps = fields.mapping("capabilities", "a mapping (in, out, tools, reranker, context)")
    modalities: dict[str, tuple[str, ...]] = {}
    for key in ("in", "out"):
        chosen: list[str] = []
        for text, line, where in caps.texts(key, "a list of modalities"):
            if text not in MODALITIES:
                fields.problems.error(
                    line, where, f"invalid modality {text!r}, must be one of: {', '.join(MODALITIES)}"
                )
                continue
            chosen.append(text)
        modalities[key] = tuple(chosen)
    result = Capabilities(
        input=modalities["in"],
        output=modalities["out"],
        tools=caps.flag("tools", False),
        reranker=caps.flag("reranker", False),
        context=caps.integer("context", 0, minimum=0),
    )
    return None if result == Capabilities() else result
