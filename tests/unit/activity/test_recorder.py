"""The recorder: rows from what a request path reports, bounds on rows and captures, queries and stats."""

import asyncio
import gzip
import json
import os

import pytest
from multidict import CIMultiDict

from llmswap.activity.captures import MIB, REDACTED, Capture, CaptureRing, packed
from llmswap.activity.query import ActivityQuery, QueryError, histogram, parse_query, percentile
from llmswap.activity.recorder import (
    SETTLE_BATCH,
    SETTLE_BYTES,
    ActivityRecorder,
    ActivitySettings,
    MemoryLog,
)
from llmswap.activity.recording import RequestFacts, RequestRecord

CHAT = "/v1/chat/completions"


def facts(model: str = "m1", path: str = CHAT, **extra) -> RequestFacts:
    headers = {"Authorization": "Bearer sk-secret", "X-Api-Key": "k", "Cookie": "c=1",
               "Content-Type": "application/json"}
    return RequestFacts(model=model, req_path=path, request_headers=headers, **extra)


def rows(recorder: ActivityRecorder):
    assert isinstance(recorder.log, MemoryLog)
    return list(recorder.log.rows)


def test_json_answer_becomes_a_row_with_its_tokens_and_a_redacted_capture():
    recorder = ActivityRecorder()
    seen = []
    recorder.listeners.append(seen.append)
    waited = RequestRecord(waited=1.75, load=1.5)  # 0.25 s in the queue, then 1.5 s for its model's load
    recording = recorder.begin(facts(requested_model="alias", key_name="apiKeys[0]", origin="http"), waited)
    recording.request_body(b'{"model":"m1"}')
    recording.response_headers(200, {"Content-Type": "application/json", "Set-Cookie": "s=1"})
    body = json.dumps({"usage": {"prompt_tokens": 3, "completion_tokens": 4}}).encode()
    recording.chunk(body[:5])
    recording.chunk(body[5:])
    record = recording.finish()
    assert record is not None and seen == [record] and rows(recorder) == [record]
    row = record.as_dict(recorder.has_capture(record.id))
    assert row["tokens"]["input_tokens"] == 3 and row["tokens"]["output_tokens"] == 4
    assert (row["queue_ms"], row["load_ms"], row["requested_model"], row["key_name"]) == (250, 1500, "alias",
                                                                                         "apiKeys[0]")
    assert row["has_capture"] is True and row["ttfb_ms"] is not None
    capture = recorder.captures.get(record.id)
    assert capture is not None and capture.req_body == b'{"model":"m1"}' and capture.resp_body == body
    assert capture.req_headers is not None and capture.resp_headers is not None
    assert capture.req_headers["Authorization"] == capture.req_headers["X-Api-Key"] == REDACTED
    assert capture.req_headers["Cookie"] == capture.resp_headers["Set-Cookie"] == REDACTED
    assert recording.finish() is None  # once only


def test_gzip_answer_is_decoded_before_reading():
    recorder = ActivityRecorder()
    recording = recorder.begin(facts())
    recording.response_headers(200, {"Content-Type": "application/json", "Content-Encoding": "gzip"})
    recording.chunk(gzip.compress(b'{"usage": {"prompt_tokens": 9, "completion_tokens": 1}}'))
    record = recording.finish()
    assert record is not None and record.tokens.input_tokens == 9


def test_upstream_error_gives_its_message_and_a_capture_with_the_body():
    recorder = ActivityRecorder()
    recording = recorder.begin(facts())
    recording.response_headers(500, {"Content-Type": "application/json"})
    recording.chunk(b'{"error": {"message": "x"}}')
    record = recording.finish()
    assert record is not None and record.error_msg == "x" and record.resp_status_code == 500
    assert record.tokens.input_tokens == 0
    capture = recorder.captures.get(record.id)
    assert capture is not None and capture.resp_body == b'{"error": {"message": "x"}}'


def test_proxy_made_error_and_html_error_give_status_text():
    recorder = ActivityRecorder()
    record = recorder.begin(facts()).finish(502, content_type="text/html", body=b"<html>bad</html>")
    assert record is not None and record.error_msg == "502 Bad Gateway"


def test_in_memory_rows_stay_within_metrics_max_in_memory_under_10k_requests():
    recorder = ActivityRecorder(ActivitySettings(max_in_memory=50, capture_mb=0.05))
    for _ in range(10_000):
        recording = recorder.begin(facts())
        recording.request_body(b"x" * 200)
        recording.response_headers(200, {"Content-Type": "application/json"})
        recording.chunk(b'{"usage": {"prompt_tokens": 1, "completion_tokens": 1}}')
        recording.finish()
    kept = rows(recorder)
    assert len(kept) == 50 and kept[-1].id == 10_000 and kept[0].id == 9_951
    assert 0 < recorder.captures.size <= recorder.captures.budget
    assert recorder.has_capture(10_000) and not recorder.has_capture(1)


def test_capture_ring_evicts_oldest_and_skips_what_never_fits():
    ring = CaptureRing(4096)
    for index in range(1, 200):
        assert ring.add(Capture(index, CHAT, {}, str(index).encode() * 20, {}, b"answer"))
    assert ring.size <= 4096 and 199 in ring and 1 not in ring
    big = Capture(500, CHAT, {}, os.urandom(8000), {}, None)  # incompressible, larger than the ring
    assert not ring.add(big) and 500 not in ring
    assert not CaptureRing(0).add(Capture(1, CHAT, None, None, None, None))


def test_capture_round_trips_with_base64_bodies():
    capture = Capture(7, CHAT, {"a": "b"}, b"\x00\xffreq", {"c": "d"}, None)
    assert Capture.decompress(capture.compress()) == capture
    shown = capture.as_dict()
    assert shown["req_body"] == "AP9yZXE=" and shown["resp_body"] is None


def test_media_routes_keep_only_their_parts():
    recorder = ActivityRecorder()
    recording = recorder.begin(facts(path="/v1/audio/transcriptions"))
    assert not recording.wants_request_body
    recording.request_body(b"audio")
    recording.response_headers(200, {"Content-Type": "application/json"})
    recording.chunk(b'{"text": "hi"}')
    record = recording.finish()
    assert record is not None
    capture = recorder.captures.get(record.id)
    assert capture is not None and capture.req_body is None and capture.resp_body == b'{"text": "hi"}'


def test_queries_filter_sort_and_page_like_llama_swap():
    recorder = ActivityRecorder()
    for model in ("m1", "m2", "m1", "m3"):
        recorder.begin(facts(model)).finish(200)
    log = recorder.log

    def ids(**params):
        query = parse_query({k: v if isinstance(v, list) else [v] for k, v in params.items()})
        return [row.id for row in asyncio.run(log.page(query)).rows]

    assert ids(model=["m1", "m3"]) == [4, 3, 1]
    assert ids(min_id="2", max_id="3") == [3, 2]
    assert ids(order="asc", limit="2", page="2") == [3, 4]
    assert ids(sort="model", order="ASC") == [1, 3, 2, 4]
    page = asyncio.run(log.page(ActivityQuery(limit=3)))
    assert page.as_dict(lambda _: False)["total_pages"] == 2


@pytest.mark.parametrize(("params", "message"), [
    ({"max_id": ["0"]}, "max_id must be >= 1"),
    ({"limit": ["1000"]}, "limit must be between 1 and 999"),
    ({"limit": ["x"]}, "invalid limit"),
    ({"page": ["0"]}, "page must be >= 1"),
    ({"sort": ["nope"]}, "invalid sort column"),
    ({"order": ["up"]}, "order must be asc or desc"),
    ({"start": ["yesterday"]}, "invalid 'start' timestamp, use RFC3339 format"),
    ({"start": ["2026-01-02T00:00:00Z"], "end": ["2026-01-01T00:00:00Z"]}, "start must be before end"),
    ({"min_id": ["3"], "max_id": ["2"]}, "min_id must be <= max_id"),
])
def test_bad_query_parameters_name_the_problem(params, message):
    with pytest.raises(QueryError, match=message.replace("(", r"\(")):
        parse_query(params)


def test_stats_sum_tokens_and_build_speed_histograms():
    recorder = ActivityRecorder()
    for input_tokens, output_tokens, cached, prompt, gen in ((1, 2, 1, 10, 20), (3, 4, 0, 30, 40)):
        recording = recorder.begin(facts("m1"))
        recording.response_headers(200, {"Content-Type": "application/json"})
        timings = {"prompt_n": input_tokens, "predicted_n": output_tokens, "cache_n": cached,
                   "prompt_per_second": prompt, "predicted_per_second": gen}
        recording.chunk(json.dumps({"timings": timings}).encode())
        recording.finish()
    recorder.begin(facts("m2")).finish(200)
    result = asyncio.run(recorder.log.stats("m1"))
    assert (result["total_requests"], result["total_input_tokens"], result["total_output_tokens"],
            result["total_cache_tokens"]) == (2, 4, 6, 1)
    assert result["prompt_histogram"]["min"] == 10 and result["gen_histogram"]["max"] == 40
    assert asyncio.run(recorder.log.stats(None))["total_requests"] == 3


def test_histogram_bins_and_percentiles():
    assert histogram([0, -1]) is None
    assert histogram([5, 5, 5]) == {"bins": [3], "min": 5, "max": 5, "binSize": 0.0, "p50": 5, "p95": 5,
                                    "p99": 5}
    result = histogram(range(1, 101))
    assert result is not None and len(result["bins"]) == 8 and sum(result["bins"]) == 100
    assert result["p50"] == pytest.approx(50.5) and percentile([1.0, 3.0], 50) == 2.0


def test_resizing_keeps_the_newest_rows():
    recorder = ActivityRecorder(ActivitySettings(max_in_memory=10))
    for _ in range(10):
        recorder.begin(facts()).finish(200)
    recorder.configure(ActivitySettings(max_in_memory=3, capture_mb=1))
    assert [r.id for r in rows(recorder)] == [8, 9, 10] and recorder.captures.budget == MIB


def test_large_captures_are_compressed_and_small_ones_kept_as_they_are():
    ring = CaptureRing(MIB)
    large = Capture(1, CHAT, {"a": "b"}, b'{"messages": "' + b"hello " * 2000 + b'"}', {}, b"ok")
    small = Capture(2, CHAT, {"a": "b"}, b'{"model": "m"}', {}, b"ok")
    assert ring.add(large) and ring.add(small)
    assert ring.size < len(large.req_body or b"")  # the large one counts at its compressed size
    assert ring.get(1) == large and ring.get(2) == small


def test_a_long_stream_is_read_from_its_two_ends_with_bounded_memory():
    from llmswap.activity.recording import StreamEnds

    def event(payload: dict) -> bytes:
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    recorder = ActivityRecorder(ActivitySettings(capture_mb=0))
    recording = recorder.begin(facts(path="/v1/messages"))
    recording.response_headers(200, {"Content-Type": "text/event-stream"})
    recording.chunk(event({"type": "message_start", "message": {"usage": {"input_tokens": 21}}}))
    delta = event({"type": "content_block_delta", "delta": {"text": "token " * 5}})
    for _ in range(20_000):  # ~1.7 MB of stream
        recording.chunk(delta)
    held = recording._stream
    assert isinstance(held, StreamEnds) and len(held._tail) <= 2 * StreamEnds.TAIL
    recording.chunk(event({"type": "message_delta", "usage": {"output_tokens": 20_000}}))
    record = recording.finish()
    assert record is not None
    assert (record.tokens.input_tokens, record.tokens.output_tokens) == (21, 20_000)


async def test_a_large_capture_is_compressed_off_the_event_loop_then_kept():
    recorder = ActivityRecorder()
    recording = recorder.begin(facts())
    recording.request_body(b'{"messages": "' + b"long prompt " * 40_000 + b'"}')  # ~480 KB
    recording.response_headers(200, {"Content-Type": "application/json"})
    recording.chunk(b'{"usage": {"prompt_tokens": 1, "completion_tokens": 1}}')
    record = recording.finish()
    assert record is not None and rows(recorder) == [record]  # the row does not wait for the capture

    for _ in range(500):
        if recorder.has_capture(record.id):
            break
        await asyncio.sleep(0.01)
    capture = recorder.captures.get(record.id)
    assert capture is not None and capture.req_body is not None and len(capture.req_body) > 400_000
    assert recorder.captures.size < 100_000  # kept compressed


def answered(recorder: ActivityRecorder, tokens: int = 1):
    recording = recorder.begin(facts())
    recording.response_headers(200, {"Content-Type": "application/json"})
    recording.chunk(b'{"usage": {"prompt_tokens": %d, "completion_tokens": 1}}' % tokens)
    return recording


async def test_finish_soon_keeps_rows_in_batches_and_settle_keeps_the_rest_first():
    recorder = ActivityRecorder()
    seen = []
    recorder.listeners.append(seen.append)
    for tokens in range(1, 4):
        answered(recorder, tokens).finish_soon()
    assert rows(recorder) == [] and seen == []  # ended, read with the next batch
    recorder.settle()  # what every reader of activity, captures and token counts does first
    assert [r.tokens.input_tokens for r in rows(recorder)] == [1, 2, 3] and len(seen) == 3
    assert [r.id for r in rows(recorder)] == [1, 2, 3] and recorder.has_capture(3)
    for _ in range(SETTLE_BATCH):
        answered(recorder).finish_soon()
    assert len(rows(recorder)) == 3 + SETTLE_BATCH  # a full batch is kept at once


async def test_a_recording_finished_soon_is_kept_without_a_reader():
    recorder = ActivityRecorder()
    recording = answered(recorder, 7)
    recording.finish_soon()
    recording.finish_soon()  # ended once: later ends do nothing
    assert recording.finish() is None
    for _ in range(500):
        if rows(recorder):
            break
        await asyncio.sleep(0.01)
    assert [r.tokens.input_tokens for r in rows(recorder)] == [7]


def test_finish_soon_without_an_event_loop_keeps_the_row_at_once():
    recorder = ActivityRecorder()
    answered(recorder, 5).finish_soon()
    assert [r.tokens.input_tokens for r in rows(recorder)] == [5]


def test_captured_headers_are_packed_and_shown_redacted_with_their_first_values():
    headers = CIMultiDict([("Authorization", "Bearer sk"), ("X-Trace", "a: b"), ("X-Trace", "c"),
                           ("X-Empty", "")])
    kept = packed(headers)
    assert isinstance(kept, str)
    capture = Capture(1, CHAT, kept, b"{}", packed({}), None)
    assert capture.shown().req_headers == {"Authorization": REDACTED, "X-Trace": "a: b", "X-Empty": ""}
    assert capture.shown().resp_headers == {}
    assert Capture.decompress(capture.compress()) == capture.shown()
    odd = {"X-Odd": "one\ntwo"}  # no parser lets a line break through; kept right all the same
    assert packed(odd) is odd and Capture(2, CHAT, packed(odd), None, None, None).shown().req_headers == odd


async def test_answers_finished_soon_are_not_held_beyond_a_bound_of_bytes():
    recorder = ActivityRecorder()
    small = answered(recorder)
    small.finish_soon()
    large = recorder.begin(facts())
    large.response_headers(200, {"Content-Type": "application/json"})
    large.chunk(b'{"data": "' + b"x" * SETTLE_BYTES + b'", "usage": {"prompt_tokens": 9}}')
    large.finish_soon()
    assert [r.tokens.input_tokens for r in rows(recorder)] == [1, 9]  # kept at once, with the one before
