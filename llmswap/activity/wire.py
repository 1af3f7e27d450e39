"""Activity rows and captures as plain tuples (numbers, strings, bytes, None and tuples of them), for a
worker process to send the rows of the requests it served to the main process, which keeps them.

`record_fields`/`record_from` and `capture_fields`/`capture_from` are inverses, except that the main
process numbers what it receives (`renumbered`): ids are the keeper's, and a worker's own count means
nothing there."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from llmswap.activity.captures import Capture, Headers
from llmswap.activity.record import NO_METADATA, ActivityRecord
from llmswap.activity.tokens import TokenStats

Fields = tuple[Any, ...]


def record_fields(record: ActivityRecord) -> Fields:
    metadata = tuple(record.metadata.items()) if record.metadata else ()
    return (*record[:6], tuple(record.tokens), *record[7:9], metadata, *record[10:])


def record_from(fields: Fields, activity_id: int) -> ActivityRecord:
    metadata: Mapping[str, str] = MappingProxyType(dict(fields[9])) if fields[9] else NO_METADATA
    return ActivityRecord(activity_id, *fields[1:6], TokenStats(*fields[6]), *fields[7:9], metadata,
                          *fields[10:])


def _headers_fields(headers: Headers | None) -> str | tuple[tuple[str, str], ...] | None:
    return headers if headers is None or isinstance(headers, str) else tuple(headers.items())


def _headers_from(fields: Any) -> Headers | None:
    return fields if fields is None or isinstance(fields, str) else dict(fields)


def capture_fields(capture: Capture) -> Fields:
    return (capture.req_path, _headers_fields(capture.req_headers), capture.req_body,
            _headers_fields(capture.resp_headers), capture.resp_body)


def capture_from(fields: Fields, activity_id: int) -> Capture:
    req_path, req_headers, req_body, resp_headers, resp_body = fields
    return Capture(activity_id, req_path, _headers_from(req_headers), req_body, _headers_from(resp_headers),
                   resp_body)
