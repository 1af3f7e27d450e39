"""The OpenAI Batch API's file formats, as pure functions: reading an input JSONL, writing the outputs.

Input: one request per line, `{"custom_id", "method": "POST", "url": <the batch's endpoint>, "body"}`, with
`custom_id` unique in the file. OpenAI also requires one model per file; llmswap does not (each model's
requests are batched on their own, see `batches.py`). Output: one line per request, in input order, in
the output file when it was answered with a 2xx and in the error file otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
COMPLETION_WINDOWS = ("24h",)
WINDOW_SECONDS = {"24h": 24 * 3600}
MAX_REPORTED_ERRORS = 20  # a broken file of 10,000 lines reports its first errors, not all of them


@dataclass(frozen=True)
class BatchLine:
    """One request of the input file."""

    line: int  # 1-based
    custom_id: str
    model: str
    body: Mapping[str, Any]


@dataclass(frozen=True)
class InputError:
    line: int | None
    code: str
    message: str
    param: str | None = None

    def as_openai(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


def parse_input(content: bytes, endpoint: str) -> tuple[list[BatchLine], list[InputError]]:
    """The requests of an input file, or what is wrong with it (then no request runs, as with OpenAI)."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], [InputError(None, "invalid_file", f"the file is not UTF-8 text: {exc}")]
    lines: list[BatchLine] = []
    errors: list[InputError] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        parsed = _parse_line(number, raw, endpoint, seen)
        if isinstance(parsed, InputError):
            errors.append(parsed)
            if len(errors) >= MAX_REPORTED_ERRORS:
                break
        else:
            seen.add(parsed.custom_id)
            lines.append(parsed)
    if not lines and not errors:
        errors.append(InputError(None, "empty_file", "the input file has no requests"))
    return lines, errors


def _parse_line(number: int, raw: str, endpoint: str, seen: set[str]) -> BatchLine | InputError:
    try:
        request = json.loads(raw)
    except ValueError as exc:
        return InputError(number, "invalid_json_line", f"line {number} is not JSON: {exc}")
    if not isinstance(request, dict):
        return InputError(number, "invalid_request", f"line {number} must be a JSON object")
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return InputError(number, "missing_required_parameter", f"line {number} needs a string custom_id",
                          "custom_id")
    if custom_id in seen:
        return InputError(number, "duplicate_custom_id",
                          f"line {number}: custom_id {custom_id!r} is used by an earlier line", "custom_id")
    if request.get("method", "POST") != "POST":
        return InputError(number, "invalid_method", f"line {number}: method must be POST", "method")
    if request.get("url") != endpoint:
        url = request.get("url")
        return InputError(number, "mismatched_endpoint",
                          f"line {number}: url {url!r} is not the batch's endpoint {endpoint}", "url")
    body = request.get("body")
    if not isinstance(body, dict):
        return InputError(number, "invalid_request", f"line {number}: body must be a JSON object", "body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return InputError(number, "missing_required_parameter", f"line {number}: body.model is required",
                          "body.model")
    return BatchLine(number, custom_id, model, body)


def answered(custom_id: str, task_id: int, status_code: int, body: Any) -> dict[str, Any]:
    """The output (or error) file record of a request the model answered, whatever the status."""
    return {"id": f"batch_req_{task_id}", "custom_id": custom_id,
            "response": {"status_code": status_code, "request_id": f"req_{task_id}", "body": body},
            "error": None}


def unanswered(custom_id: str, task_id: int, code: str, message: str) -> dict[str, Any]:
    """The error file record of a request that got no answer (not reached, cancelled, interrupted)."""
    return {"id": f"batch_req_{task_id}", "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}


def jsonl(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in records).encode()
