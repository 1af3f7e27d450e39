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
from json.scanner import make_scanner
from typing import Any, NamedTuple

UNKNOWN = -1
MAX_LINE = 1 << 20  # a longer SSE line is skipped, never buffered (no usage event is that large)
_MARKER_RE = re.compile(rb'"(?:usage|timings|metrics)"')


class TokenStats(NamedTuple):
    """The numbers of one activity row. -1 = the answer did not say; all 0 = nothing could be read.

    A named tuple: immutable like a frozen dataclass, and built in a fraction of its time (one is built
    per request)."""

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


NO_TOKENS = TokenStats()


class Reported(NamedTuple):
    """What an answer reported, before numbers are worked out: the usage counts seen, and the last
    `timings` and `metrics` objects, kept whole."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = UNKNOWN
    timings: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    found: bool = False


def _int(value: Any) -> int | None:
    if type(value) is int:  # the usual cases, first
        return value
    if value is None or isinstance(value, bool):
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


def _first_int(mapping: dict[str, Any], first: str, second: str) -> int | None:
    value = mapping.get(first)
    if type(value) is int:
        return value
    value = _int(value)
    return _int(mapping.get(second)) if value is None else value


def _cached(usage: dict[str, Any]) -> int | None:
    direct = usage.get("cache_read_input_tokens")
    if direct is not None:
        direct = _int(direct)
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
    # OpenAI's names first, as plain ints (most answers): one lookup each.
    input_tokens = usage.get("prompt_tokens")
    if type(input_tokens) is not int:
        input_tokens = _first_int(usage, "prompt_tokens", "input_tokens")
    output_tokens = usage.get("completion_tokens")
    if type(output_tokens) is not int:
        output_tokens = _first_int(usage, "completion_tokens", "output_tokens")
    cached = _cached(usage)
    if input_tokens is None and output_tokens is None and cached is None:
        return reported
    # Positional, in the field order (input, output, cached, timings, metrics, found): this runs for every
    # answer that reports usage.
    return Reported(
        input_tokens if input_tokens is not None and (input_tokens > 0 or not later)
        else reported.input_tokens,
        output_tokens if output_tokens is not None and (output_tokens > 0 or not later)
        else reported.output_tokens,
        cached if cached is not None and cached >= 0 else reported.cached_tokens,
        reported.timings, reported.metrics, True,
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
        reported = reported._replace(timings=timings, found=True)
    metrics = event.get("metrics")
    if isinstance(metrics, dict):
        reported = reported._replace(metrics=metrics, found=True)
    return reported


_SCAN = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # (text, index) → (value, end)
_USAGE_FOLLOWS, _TIMINGS_FOLLOWS, _METRICS_FOLLOWS = (
    re.compile(rb'"' + key + rb'"\s*:\s*\{') for key in (b"usage", b"timings", b"metrics"))
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
    usage = _last_object(body, b'"usage"', _USAGE_FOLLOWS)
    reported = NOTHING_REPORTED if usage is None else merge_usage(NOTHING_REPORTED, usage, later=False)
    # Most answers carry neither: a search for the key costs less than a call.
    timings = _last_object(body, b'"timings"', _TIMINGS_FOLLOWS) if b'"timings"' in body else None
    metrics = _last_object(body, b'"metrics"', _METRICS_FOLLOWS) if b'"metrics"' in body else None
    if timings is not None or metrics is not None:
        reported = reported._replace(timings=timings, metrics=metrics, found=True)
    return reported


def _last_object(body: bytes, quoted: bytes, follows: re.Pattern[bytes]) -> dict[str, Any] | None:
    """The value of the last `"key": {...}` (`quoted`: the key in its quotes) in `body` that decodes, or
    None."""
    end = len(body)
    while True:
        at = body.rfind(quoted, 0, end)
        if at < 0:
            return None
        after = at + len(quoted)
        # `"key":{` and `"key": {` (compact and Python's default separators) without the pattern
        if body.startswith(b":{", after):
            start = after + 1
        elif body.startswith(b": {", after):
            start = after + 2
        else:
            match = follows.match(body, at)
            start = -1 if match is None else match.end() - 1
        if start >= 0:
            try:
                # Decoded from the object's `{` on (a character boundary): the rest of the answer is not
                # needed. The scanner alone (what `raw_decode` calls) raises StopIteration where the
                # text is not JSON.
                value, _ = _SCAN(body[start:].decode("utf-8", errors="replace"), 0)
                return value  # a dict: it starts at `{`
            except (StopIteration, ValueError):
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


def cached_of(reported: Reported) -> int | None:
    """Prompt tokens the answer says came from the server's cache (llama.cpp's `timings.cache_n`, else the
    usage's cached count); None when it does not say."""
    if reported.timings is not None and (cache_n := _int(reported.timings.get("cache_n"))) is not None:
        return cache_n
    return reported.cached_tokens if reported.cached_tokens >= 0 else None


def token_stats(reported: Reported, wall_ms: int) -> tuple[TokenStats, int]:
    """The row's numbers and its duration (ms): `wall_ms`, or llama.cpp's own prompt + generation time
    when that is longer. Nothing reported → all zeros (llama-swap's "minimal" row)."""
    if not reported.found:
        return NO_TOKENS, wall_ms
    input_tokens, output_tokens = reported.input_tokens, reported.output_tokens
    cached = reported.cached_tokens
    timings, metrics = reported.timings, reported.metrics
    if timings is None and metrics is None:  # usage alone (most answers): counts, no speeds
        return TokenStats(cached, UNKNOWN, UNKNOWN, input_tokens, output_tokens, -1.0, -1.0), wall_ms
    draft = accepted = UNKNOWN
    prompt_speed = gen_speed = float(UNKNOWN)
    duration = wall_ms
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
