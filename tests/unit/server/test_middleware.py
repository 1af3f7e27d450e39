"""Access-log lines (no event loop). CORS preflight answers are tested in test_guard.py."""

from llmswap.server.middleware import (
    CLIENT_GONE,
    AccessRecord,
    access_line,
    too_large_message,
)


def test_access_line_names_method_path_status_duration_and_model():
    line = access_line("10.0.0.7", "POST", "/v1/chat/completions", 200, 0.0123, "qwen")
    assert line == '10.0.0.7 "POST /v1/chat/completions" 200 12.3ms model=qwen'


def test_access_line_without_a_model_or_remote():
    assert access_line(None, "GET", "/health", 200, 0.0005, "") == '- "GET /health" 200 0.5ms'


def test_access_line_says_when_the_client_left():
    line = access_line("::1", "POST", "/v1/completions", CLIENT_GONE, 1.5, "m")
    assert '"POST /v1/completions" client gone 1500.0ms model=m' in line


def test_body_limit_is_named_in_mib_when_it_is_whole():
    assert "the 32 MiB llmswap accepts" in too_large_message(32 * 1024 * 1024)
    assert "the 1000 bytes llmswap accepts" in too_large_message(1000)
    assert too_large_message(1024).endswith("raise maxRequestBodySize in the config to allow it")


def test_access_line_splits_a_served_request_into_queue_load_ttfb_and_decode():
    record = AccessRecord(model="qwen", waited=5.5, load=4.0, first_byte=5.75)
    line = access_line("::1", "POST", "/v1/chat/completions", 200, 7.0, "qwen", record)
    assert line.endswith(" model=qwen queue=1500.0ms load=4000.0ms ttfb=5750.0ms decode=1250.0ms")


def test_access_line_of_a_request_refused_before_its_first_byte_has_no_ttfb():
    record = AccessRecord(model="qwen", waited=0.25)
    line = access_line("::1", "POST", "/v1/chat/completions", 504, 1.0, "qwen", record)
    assert line.endswith(" model=qwen queue=250.0ms load=0.0ms")
