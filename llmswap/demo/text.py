"""The demo's deterministic content: answers, token counts, embeddings and rerank scores.

Everything here is a pure function of the demo's model name and the request, so the same request to the same
demo always gets the same answer, and two demos with different names never answer alike.
"""

import hashlib
import math
import re
from collections.abc import Sequence

DEFAULT_MAX_TOKENS = 16
DEFAULT_EMBEDDING_DIMENSIONS = 8

_WORDS = (
    "amber", "breeze", "cobalt", "delta", "ember", "fjord", "granite", "harbor",
    "indigo", "juniper", "kestrel", "lantern", "meadow", "nimbus", "orchid", "pebble",
)  # fmt: skip
_HEAD = ("demo", "{model}", "says:")
_WORD_RE = re.compile(r"\w+")


def _seed(*parts: str) -> bytes:
    return hashlib.sha256("\x00".join(parts).encode()).digest()


def answer_tokens(model_name: str, prompt: str, count: int) -> list[str]:
    """The answer as ``count`` tokens, each ready to append: ``demo <model> says: 1-amber 2-ember ...``.

    The numbered words depend on the prompt, so different prompts get different answers.
    """
    seed = int.from_bytes(_seed(model_name, prompt)[:8], "big")
    tokens: list[str] = []
    for i in range(count):
        if i < len(_HEAD):
            word = _HEAD[i].format(model=model_name)
        else:
            number = i - len(_HEAD) + 1
            word = f"{number}-{_WORDS[(seed + number * 7) % len(_WORDS)]}"
        tokens.append(word if i == 0 else f" {word}")
    return tokens


def count_tokens(text: str) -> int:
    """The demo's idea of a token: a run of word characters."""
    return len(_WORD_RE.findall(text))


def text_of(value: object) -> str:
    """The plain text inside a prompt, chat messages, Anthropic content blocks or Responses input items."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(part for part in (text_of(item) for item in value) if part)
    if isinstance(value, dict):
        if "content" in value:
            return text_of(value["content"])
        return text_of(value.get("text"))
    return ""


def embedding(model_name: str, text: str, dimensions: int) -> list[float]:
    """A unit-length vector of ``dimensions`` floats seeded by the model name and the text."""
    raw: list[float] = []
    block = 0
    while len(raw) < dimensions:
        digest = _seed(model_name, text, str(block))
        raw.extend(int.from_bytes(digest[i : i + 4], "big") / 2**31 - 1.0 for i in range(0, len(digest), 4))
        block += 1
    vector = raw[:dimensions]
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm else vector


def relevance_scores(model_name: str, query: str, documents: Sequence[str]) -> list[float]:
    """One score in [0, 1) per document: mostly the share of query words it contains, plus a hashed nudge
    so that ties are broken the same way every time."""
    query_words = {word.lower() for word in _WORD_RE.findall(query)}
    scores: list[float] = []
    for document in documents:
        document_words = {word.lower() for word in _WORD_RE.findall(document)}
        overlap = len(query_words & document_words) / len(query_words) if query_words else 0.0
        nudge = int.from_bytes(_seed(model_name, query, document)[:4], "big") / 2**32
        scores.append(round(0.9 * overlap + 0.1 * nudge, 6))
    return scores
