"""The activity API's questions and answers, pure: parsing `/api/metrics/activity` parameters (llama-swap's
names, limits and error texts), answering them over a list of rows, and the per-model speed statistics of
`/api/metrics/stats` (totals, histograms, percentiles).

The SQLite store answers the same `ActivityQuery` in SQL (see `store.py`); both return the same shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from llmswap.activity.record import ActivityRecord

DEFAULT_LIMIT = 25
MAX_LIMIT = 999

# sort name → (how a row sorts in memory, the SQLite column)
SORTS: dict[str, tuple[Callable[[ActivityRecord], Any], str]] = {
    "id": (lambda r: r.id, "id"),
    "time": (lambda r: int(r.timestamp), "ts_created"),
    "model": (lambda r: r.model, "model_id"),
    "req_path": (lambda r: r.req_path, "req_path"),
    "resp_status_code": (lambda r: r.resp_status_code, "resp_status_code"),
    "resp_content_type": (lambda r: r.resp_content_type, "resp_content_type"),
    "cached": (lambda r: r.tokens.cache_tokens, "cache_tokens"),
    "prompt": (lambda r: r.tokens.input_tokens, "input_tokens"),
    "generated": (lambda r: r.tokens.output_tokens, "output_tokens"),
    "drafted": (lambda r: r.tokens.draft_tokens, "draft_tokens"),
    "prompt_speed": (lambda r: r.tokens.prompt_per_second, "prompt_per_second"),
    "gen_speed": (lambda r: r.tokens.tokens_per_second, "tokens_per_second"),
    "duration": (lambda r: r.duration_ms, "duration_ms"),
}


class QueryError(ValueError):
    """A bad parameter; the message is the 400's text."""


@dataclass(frozen=True)
class ActivityQuery:
    models: tuple[str, ...] = ()
    start: int | None = None  # unix seconds, inclusive
    end: int | None = None
    min_id: int | None = None
    max_id: int | None = None
    limit: int = DEFAULT_LIMIT
    page: int = 1
    sort: str = "id"
    descending: bool = True

    def matches(self, row: ActivityRecord) -> bool:
        stamp = int(row.timestamp)
        return (
            (not self.models or row.model in self.models)
            and (self.start is None or stamp >= self.start)
            and (self.end is None or stamp <= self.end)
            and (self.min_id is None or row.id >= self.min_id)
            and (self.max_id is None or row.id <= self.max_id)
        )


def _timestamp(name: str, value: str) -> int:
    try:
        return int(datetime.fromisoformat(value.strip().replace("Z", "+00:00")).timestamp())
    except ValueError:
        raise QueryError(f"invalid '{name}' timestamp, use RFC3339 format") from None


def _id(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise QueryError(f"{name} must be >= 1") from None
    if number < 1:
        raise QueryError(f"{name} must be >= 1")
    return number


def parse_query(params: Mapping[str, Sequence[str]]) -> ActivityQuery:
    """`params`: each name's values as given. Raises `QueryError` with llama-swap's texts."""

    def one(name: str) -> str | None:
        values = params.get(name) or ()
        return values[0] if values else None

    models = tuple(dict.fromkeys(m.strip() for m in params.get("model") or () if m.strip()))
    start = _timestamp("start", raw) if (raw := one("start")) else None
    end = _timestamp("end", raw) if (raw := one("end")) else None
    if start is not None and end is not None and start > end:
        raise QueryError("start must be before end")
    min_id = _id("min_id", raw) if (raw := one("min_id")) is not None else None
    max_id = _id("max_id", raw) if (raw := one("max_id")) is not None else None
    if min_id is not None and max_id is not None and min_id > max_id:
        raise QueryError("min_id must be <= max_id")
    limit = DEFAULT_LIMIT
    if (raw := one("limit")) is not None:
        try:
            limit = int(raw)
        except ValueError:
            raise QueryError("invalid limit") from None
        if not 1 <= limit <= MAX_LIMIT:
            raise QueryError(f"limit must be between 1 and {MAX_LIMIT}")
    page = 1
    if (raw := one("page")) is not None:
        try:
            page = int(raw)
        except ValueError:
            raise QueryError("page must be >= 1") from None
        if page < 1:
            raise QueryError("page must be >= 1")
    sort = (one("sort") or "id").strip() or "id"
    if sort not in SORTS:
        raise QueryError("invalid sort column")
    order = (one("order") or "desc").strip().lower()
    if order not in ("asc", "desc"):
        raise QueryError("order must be asc or desc")
    return ActivityQuery(models, start, end, min_id, max_id, limit, page, sort, order == "desc")


@dataclass(frozen=True)
class Page:
    rows: list[ActivityRecord]
    page: int
    limit: int
    total: int

    def as_dict(self, has_capture: Callable[[int], bool]) -> dict[str, Any]:
        return {
            "data": [row.as_dict(has_capture(row.id)) for row in self.rows],
            "page": self.page, "limit": self.limit, "total": self.total,
            "total_pages": math.ceil(self.total / self.limit) if self.total else 0,
        }


def answer(rows: Iterable[ActivityRecord], query: ActivityQuery) -> Page:
    """One page of `rows` that match, ordered by the chosen column then id, both in the same direction."""
    key = SORTS[query.sort][0]
    matching = sorted((row for row in rows if query.matches(row)), key=lambda r: (key(r), r.id),
                      reverse=query.descending)
    first = (query.page - 1) * query.limit
    return Page(matching[first : first + query.limit], query.page, query.limit, len(matching))


# -------------------------------------------------------------------------------- statistics


def percentile(ordered: Sequence[float], p: float) -> float:
    """Linear interpolation at rank p/100·(n-1) of sorted values."""
    rank = p / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def histogram(values: Iterable[float]) -> dict[str, Any] | None:
    """Bins and percentiles of the positive values; None when there are none."""
    ordered = sorted(v for v in values if v > 0)
    if not ordered:
        return None
    low, high, count = ordered[0], ordered[-1], len(ordered)
    if low == high:
        bins, size = [count], 0.0
    else:
        bin_count = max(5, min(20, math.ceil(math.log2(count)) + 1))
        size = (high - low) / bin_count
        bins = [0] * bin_count
        for value in ordered:
            bins[min(int((value - low) / size), bin_count - 1)] += 1
    return {"bins": bins, "min": low, "max": high, "binSize": size, "p50": percentile(ordered, 50),
            "p95": percentile(ordered, 95), "p99": percentile(ordered, 99)}


@dataclass(frozen=True)
class StatRow:
    """The columns statistics read from one row."""

    input_tokens: int
    output_tokens: int
    cache_tokens: int
    prompt_per_second: float
    tokens_per_second: float


def stat_row(record: ActivityRecord) -> StatRow:
    t = record.tokens
    return StatRow(t.input_tokens, t.output_tokens, t.cache_tokens, t.prompt_per_second, t.tokens_per_second)


def stats(rows: Sequence[StatRow]) -> dict[str, Any]:
    """llama-swap's `/api/metrics/stats` body over every row given (error rows included)."""
    return {
        "total_requests": len(rows),
        "total_input_tokens": sum(max(r.input_tokens, 0) for r in rows),
        "total_output_tokens": sum(max(r.output_tokens, 0) for r in rows),
        "total_cache_tokens": sum(r.cache_tokens for r in rows if r.cache_tokens > 0),
        "prompt_histogram": histogram(r.prompt_per_second for r in rows),
        "gen_histogram": histogram(r.tokens_per_second for r in rows),
    }
