"""Where the proxy's log records go: `logLevel`, `logToStdout` and `logTimeFormat`, llama-swap's way.

Lines look like llama-swap's: `[INFO] message`, preceded by a timestamp when `logTimeFormat` names one of
Go's layouts (`rfc3339`, `kitchen`, ...). The `proxy` ring (served by /logs) always receives the proxy's
records; stdout receives the proxy's records, the upstreams' output, both or neither (`logToStdout`).
Upstream output reaches logging through the `llmswap.upstream` logger (one record per line, at DEBUG),
which is kept apart from the proxy's records: it has a ring of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TextIO

from llmswap.process.logring import LogRing
from llmswap.server.state import RingHandler

PROXY_LOGGER = "llmswap"
UPSTREAM_LOGGER = "llmswap.upstream"

LEVELS: Mapping[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}
_LEVEL_NAMES = {logging.DEBUG: "DEBUG", logging.INFO: "INFO", logging.WARNING: "WARN", logging.ERROR: "ERROR",
                logging.CRITICAL: "ERROR"}


def _offset(moment: datetime, colon: bool, zulu: bool) -> str:
    offset = moment.utcoffset()
    seconds = int(offset.total_seconds()) if offset is not None else 0
    if zulu and seconds == 0:
        return "Z"
    sign = "-" if seconds < 0 else "+"
    hours, minutes = divmod(abs(seconds) // 60, 60)
    return f"{sign}{hours:02d}:{minutes:02d}" if colon else f"{sign}{hours:02d}{minutes:02d}"


def _fraction(moment: datetime, digits: int, trim: bool) -> str:
    # Python keeps microseconds; Go's nanosecond layouts get them zero-padded.
    text = f"{moment.microsecond:06d}000"[:digits]
    if trim:
        text = text.rstrip("0")
    return f".{text}" if text else ""


def _day(moment: datetime) -> str:
    return f"{moment.day:>2}"  # Go's `_2`: space-padded


def _kitchen(moment: datetime) -> str:
    hour = moment.hour % 12 or 12
    return f"{hour}:{moment:%M}{'AM' if moment.hour < 12 else 'PM'}"


def _zone(moment: datetime) -> str:
    name = moment.strftime("%Z")
    if not name or (name.startswith("UTC") and len(name) > 3):  # an unnamed offset: Go prints it numerically
        return _offset(moment, colon=False, zulu=False)
    return name


# Go's named layouts (time.ANSIC ... time.StampNano), keyed by the lower-case names `logTimeFormat` accepts.
TIME_LAYOUTS: Mapping[str, Callable[[datetime], str]] = {
    "ansic": lambda t: f"{t:%a %b} {_day(t)} {t:%H:%M:%S %Y}",
    "unixdate": lambda t: f"{t:%a %b} {_day(t)} {t:%H:%M:%S} {_zone(t)} {t:%Y}",
    "rubydate": lambda t: f"{t:%a %b %d %H:%M:%S} {_offset(t, False, False)} {t:%Y}",
    "rfc822": lambda t: f"{t:%d %b %y %H:%M} {_zone(t)}",
    "rfc822z": lambda t: f"{t:%d %b %y %H:%M} {_offset(t, False, False)}",
    "rfc850": lambda t: f"{t:%A, %d-%b-%y %H:%M:%S} {_zone(t)}",
    "rfc1123": lambda t: f"{t:%a, %d %b %Y %H:%M:%S} {_zone(t)}",
    "rfc1123z": lambda t: f"{t:%a, %d %b %Y %H:%M:%S} {_offset(t, False, False)}",
    "rfc3339": lambda t: f"{t:%Y-%m-%dT%H:%M:%S}{_offset(t, True, True)}",
    "rfc3339nano": lambda t: f"{t:%Y-%m-%dT%H:%M:%S}{_fraction(t, 9, True)}{_offset(t, True, True)}",
    "kitchen": _kitchen,
    "stamp": lambda t: f"{t:%b} {_day(t)} {t:%H:%M:%S}",
    "stampmilli": lambda t: f"{t:%b} {_day(t)} {t:%H:%M:%S}{_fraction(t, 3, False)}",
    "stampmicro": lambda t: f"{t:%b} {_day(t)} {t:%H:%M:%S}{_fraction(t, 6, False)}",
    "stampnano": lambda t: f"{t:%b} {_day(t)} {t:%H:%M:%S}{_fraction(t, 9, False)}",
}


def format_timestamp(layout: str, moment: datetime) -> str:
    """`moment` in the Go layout `layout` names (case-insensitive); "" for no timestamp."""
    if not layout:
        return ""
    render = TIME_LAYOUTS.get(layout.lower())
    if render is None:
        raise ValueError(f"logTimeFormat: unknown layout {layout!r} (valid: {', '.join(TIME_LAYOUTS)})")
    return render(moment)


def level_number(name: str) -> int:
    try:
        return LEVELS[name.lower()]
    except KeyError:
        raise ValueError(f"log level {name!r} is not one of {', '.join(LEVELS)}") from None


class ProxyFormatter(logging.Formatter):
    """`<time> [LEVEL] message`, as llama-swap prints its own lines."""

    def __init__(self, time_format: str = "") -> None:
        super().__init__()
        self.time_format = time_format
        format_timestamp(time_format, datetime.now())  # an unknown layout fails here, not on every record

    def format(self, record: logging.LogRecord) -> str:
        level_name = _LEVEL_NAMES.get(record.levelno, record.levelname)
        line = self.line(level_name, record.getMessage(), record.created)
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line

    def line(self, level_name: str, message: str, created: float) -> str:
        """The line for `message` logged at `level_name` at `created` (time.time()), without a record."""
        line = f"[{level_name}] {message}"
        if self.time_format:
            stamp = format_timestamp(self.time_format, datetime.fromtimestamp(created).astimezone())
            line = f"{stamp} {line}"
        return line


def emit_line(logger: logging.Logger, level: int, line: str) -> None:
    """Hand a finished line to `logger`'s handlers as `logger.log(level, "%s", line)` would, for less: see
    `deliver_line`."""
    if logger.isEnabledFor(level):
        deliver_line(logger, level, line)


def deliver_line(logger: logging.Logger, level: int, line: str) -> None:
    """`emit_line` for a caller that has just checked `logger.isEnabledFor(level)`.

    On the access log, once per request, the walk up the stack for the caller's file and line (no format
    here prints them), the record's making and each handler formatting it again were a measurable share of
    a request's cost. So: when every handler the line would reach is one this module installed (no
    filters, the proxy's format), the line is formatted once and handed to them as text, no record made;
    otherwise (someone's own handler, filter or record factory) a record goes through logging as usual."""
    if logging.getLogRecordFactory() is not logging.LogRecord:  # someone's own records: theirs to make
        logger.handle(logger.makeRecord(logger.name, level, __file__, 0, line, (), None))
        return
    handlers = _own_handlers(logger, level)
    if handlers is None:
        logger.handle(_line_record(logger.name, level, line))
        return
    created = time.time()
    level_name = _LEVEL_NAMES.get(level) or logging.getLevelName(level)
    formatted_by: logging.Formatter | None = None
    text = ""
    for handler in handlers:
        formatter = handler.formatter
        if formatter is not formatted_by:  # the handlers configure_logging installs share one
            formatted_by = formatter
            text = formatter.line(level_name, line, created)  # type: ignore[union-attr]  # see _own_handlers
        try:
            with handler.lock or contextlib.nullcontext():  # as Handler.handle holds it around emit
                handler.put(text)
        except Exception:
            handler.handleError(_line_record(logger.name, level, line))


def _own_handlers(logger: logging.Logger, level: int) -> list[_Installed] | None:
    """The handlers a record of `level` from `logger` would reach, when every one is this module's with the
    proxy's format and nothing on the way filters; else None."""
    reached: list[_Installed] = []
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        for handler in current.handlers:
            if (not isinstance(handler, _Installed) or handler.filters
                    or type(handler.formatter) is not ProxyFormatter):
                return None
            if level >= handler.level:
                reached.append(handler)
        if not current.propagate:
            break
        current = current.parent
    return reached or None  # none at all: logging's last resort decides


_RECORD_TEMPLATES: dict[tuple[str, int, int], dict[str, Any]] = {}


def _line_record(name: str, level: int, line: str) -> logging.LogRecord:
    # Everything but the time, the thread and the message is the same for every line of one logger and
    # level (in one process): made once by LogRecord itself, then copied.
    key = (name, level, os.getpid())
    template = _RECORD_TEMPLATES.get(key)
    if template is None:
        template = vars(logging.LogRecord(name, level, __file__, 0, "", None, None)).copy()
        _RECORD_TEMPLATES[key] = template
    record = logging.LogRecord.__new__(logging.LogRecord)
    fields = record.__dict__
    fields.update(template)
    now = time.time()
    fields["created"] = now
    fields["msecs"] = int((now - int(now)) * 1000) + 0.0
    # Milliseconds since logging started, as LogRecord counts them: the template's, moved on since.
    fields["relativeCreated"] = template["relativeCreated"] + (now - template["created"]) * 1000
    if logging.logThreads:
        fields["thread"] = threading.get_ident()
        fields["threadName"] = threading.current_thread().name
    fields["msg"] = line
    return record


class _Installed(logging.Handler, ABC):
    """Marks the handlers this module installed, so configuring again (a reload) replaces them; each also
    takes a line already formatted (`put`, called with the handler's lock held)."""

    @abstractmethod
    def put(self, text: str) -> None: ...


class _Stream(logging.StreamHandler, _Installed):
    """stdout. Lines logged on a running event loop are written together once the loop's current pass ends:
    one write for a burst of access lines instead of a write (a system call, stdout is often unbuffered) per
    request. Lines logged off the loop (start, stop, other threads) are written at once, after any held."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._held: list[str] = []
        self._due_on: asyncio.AbstractEventLoop | None = None  # the loop a flush is scheduled on

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self.put(text)

    def put(self, text: str) -> None:
        held = self._held
        held.append(text + self.terminator)
        due = self._due_on
        if due is not None and due.is_running():
            return  # the loop that will flush is running: this line goes with that flush
        try:
            loop = asyncio.get_running_loop()  # a system call in Python 3.11: once per pass, not per line
        except RuntimeError:
            self.flush()  # off the loop (or its loop stopped first): now, after what was held
            return
        self._due_on = loop
        loop.call_soon(self.flush)

    def flush(self) -> None:
        # Also called by logging.shutdown at exit, so nothing held is lost when the loop stops first.
        with self.lock or contextlib.nullcontext():
            self._due_on = None
            if self._held:
                text, self._held = "".join(self._held), []
                try:
                    self.stream.write(text)
                except Exception:
                    self.handleError(logging.makeLogRecord({"msg": text}))
            super().flush()


class _Ring(RingHandler, _Installed):
    def put(self, text: str) -> None:
        self.ring.append(text)


def configure_logging(
    *,
    level: str,
    to_stdout: str,
    time_format: str,
    proxy_log: LogRing,
    stream: TextIO | None = None,
) -> None:
    """(Re)direct the proxy's and the upstreams' log records; safe to call again after a reload."""
    out = stream if stream is not None else sys.stdout
    proxy = logging.getLogger(PROXY_LOGGER)
    upstream = logging.getLogger(UPSTREAM_LOGGER)
    for logger in (proxy, upstream):
        for handler in [h for h in logger.handlers if isinstance(h, _Installed)]:
            handler.flush()  # lines held for the end of the loop's pass go out before the handler goes
            logger.removeHandler(handler)
    formatter = ProxyFormatter(time_format)

    proxy.setLevel(level_number(level))
    proxy.propagate = False  # the root logger's handlers (if any) would print every line twice
    ring = _Ring(proxy_log)
    ring.setFormatter(formatter)
    proxy.addHandler(ring)
    if to_stdout in ("proxy", "both"):
        console = _Stream(out)
        console.setFormatter(formatter)
        proxy.addHandler(console)

    # Upstream output is the upstream's own text: printed as is (prefixed by its model), or not at all.
    upstream.propagate = False
    if to_stdout in ("upstream", "both"):
        upstream.setLevel(logging.DEBUG)
        raw = _Stream(out)
        raw.setFormatter(logging.Formatter("%(message)s"))
        upstream.addHandler(raw)
    else:
        upstream.setLevel(logging.CRITICAL + 1)
