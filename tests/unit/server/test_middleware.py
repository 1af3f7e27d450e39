"""Access-log lines and the report made of every answered request (no event loop). CORS
preflight answers are tested in test_guard.py."""

import logging
from collections.abc import Iterator

import pytest

from llmswap.activity.recording import RequestRecord
from llmswap.server.http.middleware import (
    CLIENT_GONE,
    Answered,
    access_line,
    report,
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
    record = RequestRecord(model="qwen", waited=5.5, load=4.0, first_byte=5.75)
    line = access_line("::1", "POST", "/v1/chat/completions", 200, 7.0, "qwen", record)
    assert line.endswith(" model=qwen queue=1500.0ms load=4000.0ms ttfb=5750.0ms decode=1250.0ms")


def test_access_line_names_the_swap_phases_it_waited_for_and_how_many_prompt_tokens_were_cached():
    phases = (("stop", 0.3), ("start", 1.18), ("restore", 0.02))
    record = RequestRecord(model="chat", waited=1.5, load=1.5, first_byte=1.7, phases=phases, cached=1938)
    line = access_line("::1", "POST", "/v1/chat/completions", 200, 1.8, "chat", record)
    assert line.endswith(" load=1500.0ms phases=stop:300.0ms,start:1180.0ms,restore:20.0ms ttfb=1700.0ms "
                         "decode=100.0ms cached=1938")


def test_access_line_of_a_request_refused_before_its_first_byte_has_no_ttfb():
    record = RequestRecord(model="qwen", waited=0.25)
    line = access_line("::1", "POST", "/v1/chat/completions", 504, 1.0, "qwen", record)
    assert line.endswith(" model=qwen queue=250.0ms load=0.0ms")


def test_access_line_never_shows_a_negative_queue_or_decode_time():
    record = RequestRecord(model="qwen", waited=1.0, load=1.25, first_byte=2.5)
    line = access_line("::1", "POST", "/v1/chat/completions", 200, 2.0, "qwen", record)
    assert line.endswith(" model=qwen queue=0.0ms load=1250.0ms ttfb=2500.0ms decode=0.0ms")


def answered(**fields) -> Answered:
    defaults = dict(method="POST", path="/v1/chat/completions", route="/v1/chat/completions", remote="::1",
                    model="qwen", status=200, seconds=0.5)
    return Answered(**{**defaults, **fields})


@pytest.fixture
def access_records() -> Iterator[list[logging.LogRecord]]:
    """What reaches the access logger's handlers, with its level restored afterwards."""
    logger = logging.getLogger("llmswap.access")
    kept: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = kept.append  # type: ignore[method-assign]
    level = logger.level
    logger.addHandler(handler)
    yield kept
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_report_writes_the_access_line_and_tells_every_observer(access_records):
    seen: list[Answered] = []
    logging.getLogger("llmswap.access").setLevel(logging.INFO)
    report(answered(waited=0.25), [seen.append])
    [record] = access_records
    assert record.name == "llmswap.access" and record.levelno == logging.INFO
    assert record.getMessage() == ('::1 "POST /v1/chat/completions" 200 500.0ms model=qwen '
                                   'queue=250.0ms load=0.0ms')
    assert seen == [answered(waited=0.25)]


def test_report_with_the_access_log_off_writes_nothing_but_still_tells_the_observers(access_records):
    seen: list[Answered] = []
    logging.getLogger("llmswap.access").setLevel(logging.WARNING)
    report(answered(status=CLIENT_GONE), [seen.append])
    assert access_records == []
    assert [a.status for a in seen] == [CLIENT_GONE]


def test_a_failing_observer_does_not_keep_the_others_from_being_told(access_records, caplog):
    seen: list[Answered] = []

    def broken(_: Answered) -> None:
        raise RuntimeError("observer bug")

    with caplog.at_level(logging.ERROR, logger="llmswap.server"):
        report(answered(), [broken, seen.append])
    assert len(seen) == 1
    failures = [r.getMessage() for r in caplog.records if r.name == "llmswap.server"]
    assert failures == ["request observer failed for POST /v1/chat/completions"]
