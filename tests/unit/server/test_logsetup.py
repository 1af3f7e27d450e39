"""Log formatting and routing: Go time layouts, llama-swap's line shape, what reaches stdout and the ring."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone

import pytest

from llmswap.process.logring import LogRing
from llmswap.server.observe.logsetup import (
    PROXY_LOGGER,
    TIME_LAYOUTS,
    UPSTREAM_LOGGER,
    ProxyFormatter,
    configure_logging,
    emit_line,
    format_timestamp,
)

# Go's reference time, in a zone 7 hours west of UTC, with some microseconds.
REFERENCE = datetime(2006, 1, 2, 15, 4, 5, 120000, tzinfo=timezone(timedelta(hours=-7)))


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ("ansic", "Mon Jan  2 15:04:05 2006"),
        ("unixdate", "Mon Jan  2 15:04:05 -0700 2006"),
        ("rubydate", "Mon Jan 02 15:04:05 -0700 2006"),
        ("rfc822", "02 Jan 06 15:04 -0700"),
        ("rfc822z", "02 Jan 06 15:04 -0700"),
        ("rfc850", "Monday, 02-Jan-06 15:04:05 -0700"),
        ("rfc1123", "Mon, 02 Jan 2006 15:04:05 -0700"),
        ("rfc1123z", "Mon, 02 Jan 2006 15:04:05 -0700"),
        ("rfc3339", "2006-01-02T15:04:05-07:00"),
        ("rfc3339nano", "2006-01-02T15:04:05.12-07:00"),
        ("kitchen", "3:04PM"),
        ("stamp", "Jan  2 15:04:05"),
        ("stampmilli", "Jan  2 15:04:05.120"),
        ("stampmicro", "Jan  2 15:04:05.120000"),
        ("stampnano", "Jan  2 15:04:05.120000000"),
    ],
)
def test_go_layouts(layout: str, expected: str) -> None:
    assert format_timestamp(layout, REFERENCE) == expected


def test_every_layout_the_config_accepts_is_known() -> None:
    from llmswap.config.settings_section import LOG_TIME_FORMATS

    assert {name for name in LOG_TIME_FORMATS if name} == set(TIME_LAYOUTS)


def test_rfc3339_writes_utc_as_z() -> None:
    assert format_timestamp("rfc3339", REFERENCE.astimezone(UTC)) == "2006-01-02T22:04:05Z"
    assert format_timestamp("RFC3339", REFERENCE) == "2006-01-02T15:04:05-07:00"


def test_no_layout_means_no_timestamp_and_an_unknown_one_is_refused() -> None:
    assert format_timestamp("", REFERENCE) == ""
    with pytest.raises(ValueError, match="logTimeFormat"):
        format_timestamp("iso", REFERENCE)


def test_lines_look_like_llama_swaps() -> None:
    record = logging.LogRecord("llmswap.x", logging.WARNING, __file__, 1, "model %s gone", ("a",), None)
    assert ProxyFormatter().format(record) == "[WARN] model a gone"
    stamped = ProxyFormatter("kitchen").format(record)
    assert stamped.endswith(" [WARN] model a gone")
    assert stamped.split(" ")[0].endswith(("AM", "PM"))


def proxy_logging(out: io.StringIO | None = None) -> tuple[io.StringIO, LogRing]:
    """llmswap's proxy log at info to `out` (a fresh buffer by default) and a ring, without timestamps."""
    out = io.StringIO() if out is None else out
    ring = LogRing("proxy")
    configure_logging(level="info", to_stdout="proxy", time_format="", proxy_log=ring, stream=out)
    return out, ring


@pytest.fixture
def restore_loggers() -> Iterator[None]:
    saved = {}
    for name in (PROXY_LOGGER, UPSTREAM_LOGGER):
        logger = logging.getLogger(name)
        saved[name] = (logger.level, logger.propagate, list(logger.handlers))
    yield
    for name, (level, propagate, handlers) in saved.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.propagate = propagate
        logger.handlers[:] = handlers


def emit_both() -> None:
    logging.getLogger("llmswap.router").info("swap done")
    logging.getLogger("llmswap.router").debug("detail")
    logging.getLogger(UPSTREAM_LOGGER).debug("[a] upstream says hi")


@pytest.mark.parametrize(
    ("to_stdout", "proxy_shown", "upstream_shown"),
    [("proxy", True, False), ("upstream", False, True), ("both", True, True), ("none", False, False)],
)
@pytest.mark.usefixtures("restore_loggers")
def test_log_to_stdout_chooses_what_is_printed(
    to_stdout: str, proxy_shown: bool, upstream_shown: bool
) -> None:
    out = io.StringIO()
    ring = LogRing("proxy")
    configure_logging(level="info", to_stdout=to_stdout, time_format="", proxy_log=ring, stream=out)
    emit_both()
    printed = out.getvalue()
    assert ("[INFO] swap done" in printed) is proxy_shown
    assert ("[a] upstream says hi" in printed) is upstream_shown
    assert "detail" not in printed
    # The proxy ring always has the proxy's records, never the upstream's output (it has its own ring).
    assert ring.history() == ["[INFO] swap done"]


@pytest.mark.usefixtures("restore_loggers")
def test_configuring_again_replaces_the_handlers() -> None:
    first, second = io.StringIO(), io.StringIO()
    ring = LogRing("proxy")
    configure_logging(level="info", to_stdout="proxy", time_format="", proxy_log=ring, stream=first)
    configure_logging(level="debug", to_stdout="proxy", time_format="", proxy_log=ring, stream=second)
    emit_both()
    assert first.getvalue() == ""
    assert second.getvalue().splitlines() == ["[INFO] swap done", "[DEBUG] detail"]
    assert ring.history() == ["[INFO] swap done", "[DEBUG] detail"]


@pytest.mark.usefixtures("restore_loggers")
def test_a_line_emitted_without_the_caller_lookup_reaches_the_same_places_looking_the_same() -> None:
    out, ring = proxy_logging()
    access = logging.getLogger("llmswap.access")
    access.info("%s", "via logging")
    emit_line(access, logging.INFO, "via emit_line")
    emit_line(access, logging.DEBUG, "below the level")
    assert out.getvalue().splitlines() == ["[INFO] via logging", "[INFO] via emit_line"]
    assert ring.history() == ["[INFO] via logging", "[INFO] via emit_line"]


def test_a_line_record_carries_what_a_logged_one_does_with_its_own_time_and_message() -> None:
    logger = logging.getLogger("llmswap.access")
    kept: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = kept.append  # type: ignore[method-assign]
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        emit_line(logger, logging.INFO, "first")
        before = time.time()
        emit_line(logger, logging.INFO, "second")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    first, second = kept
    assert (first.getMessage(), second.getMessage()) == ("first", "second")
    assert second.created >= before and second.relativeCreated >= first.relativeCreated
    assert second.name == "llmswap.access" and second.levelname == "INFO" and second.exc_info is None
    made = logging.LogRecord("llmswap.access", logging.INFO, "x.py", 0, "second", None, None)
    assert set(vars(second)) - {"message"} == set(vars(made))  # "message": set by a formatter on the way
    assert (second.thread, second.threadName, second.process) == (made.thread, made.threadName, made.process)


class CountingStream(io.StringIO):
    """Counts the writes that reach it: each is a system call on a real, unbuffered stdout."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


@pytest.mark.usefixtures("restore_loggers")
def test_lines_logged_in_one_pass_of_the_loop_reach_stdout_in_one_write() -> None:
    out = CountingStream()
    _, ring = proxy_logging(out)
    access = logging.getLogger("llmswap.access")

    async def burst() -> tuple[str, int]:
        for number in range(5):
            emit_line(access, logging.INFO, f"request {number}")
        held = out.getvalue(), out.writes  # nothing written while the pass runs
        await asyncio.sleep(0)  # the pass ends: the held lines go out
        return held

    held, writes_during = asyncio.run(burst())
    assert (held, writes_during) == ("", 0)
    assert out.writes == 1
    assert out.getvalue().splitlines() == [f"[INFO] request {n}" for n in range(5)]
    assert ring.history() == [f"[INFO] request {n}" for n in range(5)]  # the ring is not held back


@pytest.mark.usefixtures("restore_loggers")
def test_lines_off_the_loop_are_written_at_once_and_held_lines_survive_a_stopped_loop() -> None:
    out = CountingStream()
    configure_logging(level="info", to_stdout="proxy", time_format="", proxy_log=LogRing("proxy"), stream=out)
    proxy = logging.getLogger("llmswap")
    proxy.info("before the loop")
    assert out.getvalue() == "[INFO] before the loop\n"

    loop = asyncio.new_event_loop()
    loop.run_until_complete(asyncio.sleep(0))
    # A line logged in the loop's very last step: the loop stops before its pass ends.
    loop.call_soon(lambda: (proxy.info("last words"), loop.stop()))
    loop.run_forever()
    loop.close()
    proxy.info("after the loop")  # off the loop: what was held goes first, in order
    expected = ["[INFO] before the loop", "[INFO] last words", "[INFO] after the loop"]
    assert out.getvalue().splitlines() == expected


@pytest.mark.usefixtures("restore_loggers")
def test_configuring_again_writes_out_the_lines_the_old_handler_held() -> None:
    first, second = io.StringIO(), io.StringIO()
    ring = LogRing("proxy")
    configure_logging(level="info", to_stdout="proxy", time_format="", proxy_log=ring, stream=first)

    async def log_then_reload() -> None:
        logging.getLogger("llmswap").info("held")
        configure_logging(level="info", to_stdout="proxy", time_format="", proxy_log=ring, stream=second)

    asyncio.run(log_then_reload())
    assert first.getvalue() == "[INFO] held\n" and second.getvalue() == ""


@pytest.mark.usefixtures("restore_loggers")
def test_a_line_with_a_timestamp_reads_as_a_logged_one_on_stdout_and_in_the_ring() -> None:
    out = io.StringIO()
    ring = LogRing("proxy")
    configure_logging(level="info", to_stdout="proxy", time_format="rfc3339nano", proxy_log=ring, stream=out)
    access = logging.getLogger("llmswap.access")
    access.info("%s", "via logging")
    emit_line(access, logging.INFO, "via emit_line")
    logged, emitted = out.getvalue().splitlines()
    assert ring.history() == [logged, emitted]
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)"
    assert re.fullmatch(stamp + r" \[INFO\] via logging", logged)
    assert re.fullmatch(stamp + r" \[INFO\] via emit_line", emitted)


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.usefixtures("restore_loggers")
def test_a_handler_of_someone_elses_still_gets_each_line_as_a_record_beside_llmswaps() -> None:
    out, ring = proxy_logging()
    theirs = Kept()
    logging.getLogger(PROXY_LOGGER).addHandler(theirs)
    emit_line(logging.getLogger("llmswap.access"), logging.INFO, "a request")
    assert [(r.name, r.levelname, r.getMessage()) for r in theirs.records] == [
        ("llmswap.access", "INFO", "a request")]
    assert out.getvalue() == "[INFO] a request\n" and ring.history() == ["[INFO] a request"]


@pytest.mark.usefixtures("restore_loggers")
def test_a_filter_on_the_way_still_decides_whether_a_line_is_written() -> None:
    out, ring = proxy_logging()
    access = logging.getLogger("llmswap.access")
    refuse = logging.Filter("somewhere.else")  # passes no record of llmswap's
    access.addFilter(refuse)
    try:
        emit_line(access, logging.INFO, "filtered out")
    finally:
        access.removeFilter(refuse)
    emit_line(access, logging.INFO, "let through")
    assert out.getvalue() == "[INFO] let through\n" and ring.history() == ["[INFO] let through"]


@pytest.mark.usefixtures("restore_loggers")
def test_a_handlers_own_level_and_formatter_still_apply_to_a_line() -> None:
    out, ring = proxy_logging()
    access = logging.getLogger("llmswap.access")
    ring_handler, stdout_handler = logging.getLogger(PROXY_LOGGER).handlers
    stdout_handler.setLevel(logging.WARNING)
    emit_line(access, logging.INFO, "ring only")
    ring_handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    emit_line(access, logging.WARNING, "both")
    assert ring.history() == ["[INFO] ring only", "llmswap.access: both"]
    assert out.getvalue() == "[WARN] both\n"


@pytest.mark.usefixtures("restore_loggers")
def test_a_record_factory_of_someone_elses_still_makes_the_record_of_each_line() -> None:
    out, ring = proxy_logging()
    made: list[str] = []
    factory = logging.getLogRecordFactory()

    def counting(*args, **kwargs) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        made.append(record.getMessage())
        return record

    logging.setLogRecordFactory(counting)
    try:
        emit_line(logging.getLogger("llmswap.access"), logging.INFO, "a request")
    finally:
        logging.setLogRecordFactory(factory)
    assert made == ["a request"]
    assert out.getvalue() == "[INFO] a request\n" and ring.history() == ["[INFO] a request"]
