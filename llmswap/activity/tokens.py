"""Token counts and speeds read from an upstream's answer: pure functions, no I/O.

What an answer may carry, and where (llama-swap reads the same places, so rows compare):
- `usage` (OpenAI chat/completions, the Responses API at `response.usage`, Anthropic at the top level and
  in `message_start` at `message.usage`): input, output and cached token counts;
- llama.cpp's `timings`: prompt_n/predicted_n (which replace the usage counts), prompt_per_second,
  predicted_per_second, prompt_ms + predicted_ms, cache_n, draft_n/draft_n_accepted;
- vLLM's `metrics`: `speculative_decoding.num_draft_tokens`/`num_accepted_draft_tokens`,
  `time_to_first_token_ms` (→ prompt speed) and `mean_itl_ms` (→ generation speed).

A JSON answer is read whole (`read_json_answer`); an event stream is read as it passes (`SseScanner`):
complete `data:` lines are looked at one by one, only those naming one of the fields above are parsed,
and nothing but the current partial line is held, so a long stream costs no memory.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

UNKNOWN = -1
MAX_LINE = 1 << 20  # a longer SSE line is skipped, never buffered (no usage event is that large)
_MARKER_RE = re.compile(rb'"(?:usage|timings|metrics)"')


@dataclass(frozen=True)
class TokenStats:
    """The numbers of one activity row. -1 = the answer did not say; all 0 = nothing could be read."""

    cache_tokens: int = 0
    draft_tokens: int = 0
    draft_acc_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    prompt_per_second: float = 0.0
    tokens_per_second: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "cache_tokens": self.cache_tokens, "draft_tokens": self.draft_tokens,
            "draft_acc_tokens": self.draft_acc_tokens, "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens, "prompt_per_second": self.prompt_per_second,
            "tokens_per_second": self.tokens_per_second,
        }


@dataclass(frozen=True)
class Reported:
    """What an answer reported, before numbers are worked out: the usage counts seen, and the last
    `timings` and `metrics` objects, kept whole."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = UNKNOWN
    timings: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    found: bool = False


def _int(value: Any) -> int | None:
    if type(value) is int:  # the usual case, first
        return value
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _first_int(mapping: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = _int(mapping.get(key))
        if value is not None:
            return value
    return None


def _cached(usage: dict[str, Any]) -> int | None:
    direct = _int(usage.get("cache_read_input_tokens"))
    if direct is not None:
        return direct
    for details in ("input_tokens_details", "prompt_tokens_details"):
        inner = usage.get(details)
        if isinstance(inner, dict):
            value = _int(inner.get("cached_tokens"))
            if value is not None:
                return value
    return None


def merge_usage(reported: Reported, usage: Any, *, later: bool) -> Reported:
    """`reported` with one usage object folded in. A later object (a stream's following event) replaces
    input/output only with values > 0 and cached with values >= 0: Anthropic's `message_delta` carries
    output only, after `message_start` carried input."""
    if not isinstance(usage, dict):
        return reported
    input_tokens = _first_int(usage, "prompt_tokens", "input_tokens")
    output_tokens = _first_int(usage, "completion_tokens", "output_tokens")
    cached = _cached(usage)
    if input_tokens is None and output_tokens is None and cached is None:
        return reported
    # Built directly (not `dataclasses.replace`): this runs for every answer that reports usage.
    return Reported(
        input_tokens=input_tokens if input_tokens is not None and (input_tokens > 0 or not later)
        else reported.input_tokens,
        output_tokens=output_tokens if output_tokens is not None and (output_tokens > 0 or not later)
        else reported.output_tokens,
        cached_tokens=cached if cached is not None and cached >= 0 else reported.cached_tokens,
        timings=reported.timings, metrics=reported.metrics, found=True,
    )


def fold_event(reported: Reported, event: Any) -> Reported:
    """`reported` with one JSON document (a whole answer or one stream event) folded in."""
    if not isinstance(event, dict):
        return reported
    later = reported.found
    usage = event.get("usage")
    if isinstance(usage, dict):
        reported = merge_usage(reported, usage, later=later)
        later = later or reported.found
    for outer in ("response", "message"):
        inner = event.get(outer)
        usage = inner.get("usage") if isinstance(inner, dict) else None
        if isinstance(usage, dict):
            reported = merge_usage(reported, usage, later=later)
            later = later or reported.found
    timings = event.get("timings")
    if isinstance(timings, dict):
        reported = replace(reported, timings=timings, found=True)
    metrics = event.get("metrics")
    if isinstance(metrics, dict):
        reported = replace(reported, metrics=metrics, found=True)
    return reported


_DECODER = json.JSONDecoder()
_KEYS = ("usage", "timings", "metrics")
_KEY_FOLLOWS = {key: re.compile(rb'"' + key.encode() + rb'"\s*:\s*\{') for key in _KEYS}
NOTHING_REPORTED = Reported()


def read_json_answer(body: bytes, path: str = "") -> Reported:
    """What a whole JSON answer reported. llama.cpp's `/infill` answers with a list: its last element's
    `timings` count.

    An object answer is not parsed whole: only the last `usage`, `timings` and `metrics` objects are, found
    by searching for their keys from the end, where an answer puts them (inside a JSON string a quote is
    escaped, so `"usage": {` there cannot match). An answer is mostly generated text; reading just these
    keeps the cost per request small."""
    if body[:1] != b"{" and body.lstrip()[:1] != b"{":
        return _read_whole(body, path)
    found: dict[str, Any] = {}
    for key in _KEYS:
        value = _last_object(body, key)
        if value is not None:
            found[key] = value
    return fold_event(NOTHING_REPORTED, found) if found else NOTHING_REPORTED


def _last_object(body: bytes, key: str) -> Any:
    """The value of the last `"key": {...}` in `body` that decodes, or None."""
    quoted = b'"' + key.encode() + b'"'
    follows = _KEY_FOLLOWS[key]
    end = len(body)
    while True:
        at = body.rfind(quoted, 0, end)
        if at < 0:
            return None
        match = follows.match(body, at)
        if match is not None:
            try:
                # Decoded from the object's `{` on (a character boundary): the rest of the answer is not
                # needed.
                value, _ = _DECODER.raw_decode(body[match.end() - 1 :].decode("utf-8", errors="replace"))
                return value
            except ValueError:
                pass
        end = at


def _read_whole(body: bytes, path: str) -> Reported:
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return Reported()
    if isinstance(document, list):
        if path.startswith("/infill") and document and isinstance(document[-1], dict):
            return fold_event(Reported(), {"timings": document[-1].get("timings")})
        return Reported()
    return fold_event(Reported(), document)


class SseScanner:
    """Reads an event stream chunk by chunk, keeping only the unfinished last line."""

    def __init__(self) -> None:
        self.reported = Reported()
        self._partial = bytearray()
        self._skipping = False  # inside a line longer than MAX_LINE

    def feed(self, chunk: bytes) -> None:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                break
            if self._skipping:
                self._skipping = False
            elif self._partial:
                self._partial += chunk[start:end]
                self._line(bytes(self._partial))
                self._partial.clear()
            else:
                self._line(chunk[start:end])
            start = end + 1
        rest = chunk[start:]
        if self._skipping or not rest:
            return
        if len(self._partial) + len(rest) > MAX_LINE:
            self._partial.clear()
            self._skipping = True
        else:
            self._partial += rest

    def finish(self) -> Reported:
        """What the stream reported (a last line without a newline counts too)."""
        if self._partial and not self._skipping:
            self._line(bytes(self._partial))
        self._partial.clear()
        return self.reported

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:") or _MARKER_RE.search(line) is None:
            return
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]":
            return
        try:
            event = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            return
        self.reported = fold_event(self.reported, event)


def token_stats(reported: Reported, wall_ms: int) -> tuple[TokenStats, int]:
    """The row's numbers and its duration (ms): `wall_ms`, or llama.cpp's own prompt + generation time
    when that is longer. Nothing reported → all zeros (llama-swap's "minimal" row)."""
    if not reported.found:
        return TokenStats(), wall_ms
    input_tokens, output_tokens = reported.input_tokens, reported.output_tokens
    cached = reported.cached_tokens
    draft = accepted = UNKNOWN
    prompt_speed = gen_speed = float(UNKNOWN)
    duration = wall_ms
    timings = reported.timings
    if timings is not None:
        input_tokens = _int(timings.get("prompt_n")) or 0
        output_tokens = _int(timings.get("predicted_n")) or 0
        prompt_speed = _num(timings.get("prompt_per_second")) or 0.0
        gen_speed = _num(timings.get("predicted_per_second")) or 0.0
        spent = (_num(timings.get("prompt_ms")) or 0.0) + (_num(timings.get("predicted_ms")) or 0.0)
        duration = max(wall_ms, int(spent))
        cache_n = _int(timings.get("cache_n"))
        if cache_n is not None:
            cached = cache_n
        draft_n, draft_ok = _int(timings.get("draft_n")), _int(timings.get("draft_n_accepted"))
        if draft_n is not None and draft_ok is not None:
            draft, accepted = draft_n, draft_ok
    metrics = reported.metrics
    if metrics is not None:
        spec = metrics.get("speculative_decoding")
        if isinstance(spec, dict):
            drafted, kept = _int(spec.get("num_draft_tokens")), _int(spec.get("num_accepted_draft_tokens"))
            if drafted is not None and kept is not None:
                draft, accepted = drafted, kept
        ttft = _num(metrics.get("time_to_first_token_ms"))
        if ttft is not None and ttft > 0:
            prompt_speed = (input_tokens - max(cached, 0)) / (ttft / 1000)
        itl = _num(metrics.get("mean_itl_ms"))
        if itl is not None and itl > 0:
            gen_speed = 1000 / itl
    stats = TokenStats(
        cache_tokens=cached, draft_tokens=draft, draft_acc_tokens=accepted, input_tokens=input_tokens,
        output_tokens=output_tokens, prompt_per_second=prompt_speed, tokens_per_second=gen_speed,
    )
    return stats, duration
