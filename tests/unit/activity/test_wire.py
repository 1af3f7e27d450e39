"""Rows and captures cross between processes as plain tuples and come back equal, renumbered."""

from __future__ import annotations

import marshal
from types import MappingProxyType

from llmswap.activity.captures import Capture, packed
from llmswap.activity.record import ActivityRecord
from llmswap.activity.tokens import TokenStats
from llmswap.activity.wire import capture_fields, capture_from, record_fields, record_from


def test_a_full_row_crosses_as_plain_values_and_comes_back_equal_under_the_keepers_id() -> None:
    row = ActivityRecord(7, 1700000000.5, "a", "/v1/chat/completions", 200, "application/json",
                         TokenStats(1, 2, 3, 4, 5, 6.5, 7.5), 12, "", MappingProxyType({"k": "v"}), "alias",
                         "http", "apiKeys[0]", 1699999999.0, 3, None, 4)
    sent = marshal.loads(marshal.dumps(record_fields(row)))  # only plain values survive marshal
    assert record_from(sent, 41) == row._replace(id=41)
    bare = ActivityRecord(8, 1.0, "b", "/v1/embeddings", 502, error_msg="upstream broke")
    assert record_from(marshal.loads(marshal.dumps(record_fields(bare))), 42) == bare._replace(id=42)


def test_a_capture_crosses_with_packed_or_mapped_headers_and_bodies() -> None:
    capture = Capture(7, "/v1/chat/completions", packed({"Content-Type": "application/json", "X-A": "1"}),
                      b'{"model":"a"}', {"Content-Type": "application/json"}, b'{"ok":true}')
    sent = marshal.loads(marshal.dumps(capture_fields(capture)))
    assert capture_from(sent, 41) == capture._replace(id=41)
    assert capture_from(sent, 41).shown().req_headers == {"Content-Type": "application/json", "X-A": "1"}
    empty = Capture(8, "/v1/audio/speech", None, None, None, None)
    assert capture_from(marshal.loads(marshal.dumps(capture_fields(empty))), 9) == empty._replace(id=9)
