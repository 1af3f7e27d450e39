"""One activity row: what a finished request was, how long it waited and took, what it cost in tokens.

`as_dict` gives llama-swap's wire shape (`/api/metrics/activity`), plus llmswap's own fields beside it
(the model asked for, the origin, the key's name, queue and load waits, time to first byte), which
llama-swap's UI ignores and llmswap's shows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from http import HTTPStatus
from types import MappingProxyType
from typing import Any, NamedTuple

from llmswap.activity.tokens import NO_TOKENS, TokenStats

ERROR_TEXT_LIMIT = 500
NO_METADATA: Mapping[str, str] = MappingProxyType({})
NO_PHASES: Mapping[str, int] = MappingProxyType({})


class ActivityRecord(NamedTuple):
    """One row. A named tuple: immutable like a frozen dataclass, and built in a fraction of its time (one
    is built per request)."""

    id: int
    timestamp: float  # wall clock when the row was recorded (the request's end)
    model: str  # the model that served: a local model's id, or the name a peer was asked for
    req_path: str
    resp_status_code: int
    resp_content_type: str = ""
    tokens: TokenStats = NO_TOKENS
    duration_ms: int = 0
    error_msg: str = ""
    metadata: Mapping[str, str] = NO_METADATA
    # llmswap's own
    requested_model: str = ""  # as the client named it (an alias, a selector...)
    origin: str = "http"  # "http" | "task" | "batch"
    key_name: str = ""  # which API key was used (its place in apiKeys, never the key)
    started: float = 0.0  # wall clock when the request arrived
    queue_ms: int | None = None  # waiting behind other requests for the model
    load_ms: int | None = None  # waiting for a swap this request caused or joined
    ttfb_ms: int | None = None  # arrival → first byte of the answer
    restore_ms: int | None = None  # of load_ms, restoring the model's saved KV cache (kvCache models)
    # The phases of the swap it waited for, milliseconds each (drain, save, stop, prefetch, start, restore,
    # wake; a phase of several models summed); empty when it waited for none.
    phases: Mapping[str, int] = NO_PHASES

    def as_dict(self, has_capture: bool = False) -> dict[str, Any]:
        row: dict[str, Any] = {
            "id": self.id,
            "timestamp": rfc3339(self.timestamp),
            "model": self.model,
            "req_path": self.req_path,
            "resp_content_type": self.resp_content_type,
            "resp_status_code": self.resp_status_code,
            "tokens": self.tokens.as_dict(),
            "duration_ms": self.duration_ms,
            "has_capture": has_capture,
            "requested_model": self.requested_model,
            "origin": self.origin,
            "key_name": self.key_name,
            "started": rfc3339(self.started) if self.started else None,
            "queue_ms": self.queue_ms,
            "load_ms": self.load_ms,
            "ttfb_ms": self.ttfb_ms,
            "restore_ms": self.restore_ms,
            "phases_ms": dict(self.phases),
        }
        if self.error_msg:
            row["error_msg"] = self.error_msg
        if self.metadata:
            row["metadata"] = dict(self.metadata)
        return row


def rfc3339(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def error_message(status: int, body: bytes | None) -> str:
    """A failed answer's message: `error.message`, `error`, `message` or `detail` from a JSON body (cut
    to 500 characters), else the status line."""
    if body:
        try:
            document = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            document = None
        if isinstance(document, dict):
            error = document.get("error")
            candidates = (error.get("message") if isinstance(error, dict) else None, error,
                          document.get("message"), document.get("detail"))
            for candidate in candidates:
                if isinstance(candidate, str) and candidate.strip():
                    text = candidate.strip()
                    return text if len(text) <= ERROR_TEXT_LIMIT else text[:ERROR_TEXT_LIMIT] + "..."
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"
