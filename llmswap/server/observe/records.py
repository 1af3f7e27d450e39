"""JSON-ready renderings of config values that the model list and the events stream both show."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmswap.config.model import Capabilities

# Top-level keys the capabilities renderer owns: a model's metadata may not shadow them.
CAPABILITY_KEYS = frozenset({"architecture", "capabilities", "supported_parameters", "context_length"})


def render_capabilities(caps: Capabilities) -> dict[str, Any]:
    """`models.<id>.capabilities` as the OpenRouter-style keys clients read from a model list."""
    fields: dict[str, Any] = {}
    inputs, outputs = list(caps.input), list(caps.output)
    architecture: dict[str, Any] = {}
    if inputs:
        architecture["input_modalities"] = inputs
    if outputs:
        architecture["output_modalities"] = outputs
    if inputs and outputs:
        architecture["modality"] = "+".join(inputs) + "->" + "+".join(outputs)
    if architecture:
        fields["architecture"] = architecture
    flags: dict[str, bool] = {}
    if "image" in inputs:
        flags["vision"] = True
    pairs = {
        "audio_transcriptions": ("audio", "text"),
        "audio_speech": ("text", "audio"),
        "image_generation": ("text", "image"),
        "image_to_image": ("image", "image"),
    }
    for flag, (given, made) in pairs.items():
        if given in inputs and made in outputs:
            flags[flag] = True
    if caps.tools:
        flags["function_calling"] = True
        fields["supported_parameters"] = ["tools", "tool_choice"]
    if caps.reranker:
        flags["reranker"] = True
    if flags:
        fields["capabilities"] = flags
    if caps.context > 0:
        fields["context_length"] = caps.context
    return fields


def plain(value: Any) -> Any:
    """Config values (read-only mappings, tuples) as JSON-ready dicts and lists."""
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value
