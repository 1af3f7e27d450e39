"""The request's record (`RequestRecord`) and its activity recording (`Recording`).

`RequestRecord` is one value made as a request arrives (by the HTTP middleware, or by the dispatcher for a
task or a batch request), handed down the path as an argument and written where each fact becomes known
(the model named, the wait, the load and its phases, the answer's first byte, the bytes relayed, a cut); it
is read once as the request ends, for its access line and the request observers (metrics), and for its
activity row: the `Recording` of a request reads its wait and the swap's phases from it.

A `Recording` is what the request path tells about the answer (`request_body`, `response_headers`,
`chunk`, `finish`), turned into an `ActivityRecord` and, when captures are on, a `Capture`.

Nothing is buffered that the row does not need: of an event stream only its two ends are held
(`StreamEnds`), a JSON answer is held up to `JSON_BODY_LIMIT` (its chunks as they came) to be read once at
the end, and bodies are kept for a capture only while captures are on and within a bound of the ring's
size. Headers are kept as given; a capture redacts them when shown.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from llmswap.activity.captures import Capture, packed, parts_for
from llmswap.activity.record import NO_METADATA, NO_PHASES, ActivityRecord, error_message
from llmswap.activity.tokens import (
    NO_TOKENS,
    Reported,
    SseScanner,
    cached_of,
    read_json_answer,
    token_stats,
)

JSON_BODY_LIMIT = 16 * 1024 * 1024  # a whole (non-stream) answer larger than this is not read for tokens
# A stream is held for its capture up to this (or 4x the ring, if smaller: it compresses well, but many
# streams at once must not each hold megabytes); a longer one's capture keeps no response body.
STREAM_CAPTURE_LIMIT = 8 * 1024 * 1024
CLIENT_LEFT = "the client went away during the answer"
_DECODABLE = ("gzip", "x-gzip", "deflate")
NO_HEADERS: Mapping[str, str] = NO_METADATA  # an empty, read-only mapping


@dataclass(slots=True)
class RequestRecord:
    """What the path tells the access log, the observers and the activity row about one request."""

    model: str = ""
    started: float = 0.0  # time.monotonic() when the request arrived
    waited: float | None = None  # seconds from asking the router for the model to being granted it
    first_byte: float | None = None  # seconds from arrival to the first byte of the upstream's answer sent
    load: float | None = None  # seconds of `waited` its model spent loading (the rest was queueing)
    answering: bool = False  # the answer's status line went out: no other response can follow
    cut: str = ""  # why llmswap ended the request itself ("cancelled", "shutdown"), if it did
    phases: tuple[tuple[str, float], ...] = ()  # the swap's phases it waited for: (name, seconds), in order
    cached: int | None = None  # prompt tokens the upstream took from its cache, when its answer said
    placed: str = ""  # where discover peers were weighed: the host chosen and why
    sent: int = 0  # bytes of the upstream's answer relayed to the client so far

    def loaded(self, seconds: float) -> None:
        """The router's `on_granted`: of the request's wait, its model spent `seconds` loading."""
        self.load = seconds

    def relayed(self, size: int) -> None:
        """`size` bytes of the upstream's answer went to the client now (the first such call is its first
        byte)."""
        if self.first_byte is None:
            self.first_byte = time.monotonic() - self.started
        self.sent += size


class RequestFacts(NamedTuple):
    """What is known about a request when its recording begins (a named tuple: one is built per
    request)."""

    model: str  # the model that serves it (local id, or the name a peer is asked for)
    req_path: str
    requested_model: str = ""
    origin: str = "http"
    key_name: str = ""
    method: str = "POST"
    request_headers: Mapping[str, str] = NO_HEADERS
    metadata: Mapping[str, str] = NO_METADATA


class RowKeeper(Protocol):
    """Where a finished recording goes (the `ActivityRecorder`)."""

    def next_id(self) -> int: ...

    def keep(self, record: ActivityRecord, capture: Capture | None) -> None: ...

    def settle_soon(self, recording: Recording) -> None: ...


class StreamEnds:
    """The first `HEAD` and the last `TAIL`-or-so bytes of an event stream, read for tokens at its end.

    Where the counts are: the last events (OpenAI's usage chunk, llama.cpp's timings, the Responses API's
    `response.completed`, Anthropic's `message_delta`) and the first one (Anthropic's `message_start`).
    Holding the two ends costs one copy per chunk and nothing per line, however long the stream.
    """

    HEAD = 8 * 1024
    TAIL = 32 * 1024

    def __init__(self) -> None:
        self._head = bytearray()
        self._tail = bytearray()
        self._trimmed = False
        # Events relayed (`data:` lines, one per token from llama-server and most servers): what a stream
        # cut before its usage event is counted by. An event split across two chunks may be missed.
        self.events = 0

    def feed(self, data: bytes) -> None:
        self.events += data.count(b"data:")
        if len(self._head) < self.HEAD:
            self._head += data[: self.HEAD - len(self._head)]
        self._tail += data
        if len(self._tail) > 2 * self.TAIL:
            del self._tail[: -self.TAIL]
            self._trimmed = True

    def reported(self) -> Reported:
        scanner = SseScanner()
        if not self._trimmed:
            scanner.feed(bytes(self._tail))  # the whole stream
            return scanner.finish()
        head_end = self._head.rfind(b"\n")
        scanner.feed(bytes(self._head[: head_end + 1]))
        # The tail starts inside some line: from its first line break on.
        scanner.feed(bytes(self._tail[self._tail.find(b"\n") + 1 :]))
        return scanner.finish()


class Recording:
    """Made by `ActivityRecorder.begin`; `finish` once (later calls do nothing).

    Cheap per request: the answer's chunks are kept as they came (no copy) and read once, at the end; the
    headers are kept as given and redacted only when a capture is shown."""

    __slots__ = (
        "_body_overflow",
        "_capture_limit",
        "_content_type",
        "_decode_error",
        "_decoder",
        "_elapsed",
        "_end_status",
        "_error",
        "_failure",
        "_finished",
        "_keeper",
        "_kept_parts",
        "_left",
        "_limit",
        "_parts",
        "_raw_response_headers",
        "_read",
        "_request_body",
        "_size",
        "_started",
        "_status",
        "_stream",
        "_ttfb_ms",
        "facts",
        "record",
        "started",
    )

    def __init__(self, facts: RequestFacts, keeper: RowKeeper, capture_limit: int,
                 record: RequestRecord | None = None) -> None:
        self.facts = facts
        # The request's wait, load and the swap's phases are read from its record when the row is made.
        self.record = record if record is not None else RequestRecord(started=time.monotonic())
        self._keeper = keeper
        self.started = time.time()
        self._started = time.perf_counter()
        self._capture_limit = capture_limit  # 0: no capture
        # What a capture of this route keeps (request headers, request body, response headers, response
        # body); None: no capture.
        self._kept_parts = parts_for(facts.req_path) if capture_limit > 0 else None
        self._request_body: bytes | None = None
        self._ttfb_ms: int | None = None
        self._status: int | None = None
        self._content_type = ""
        self._raw_response_headers: Mapping[str, str] | None = None
        self._decoder: zlib._Decompress | None = None
        self._decode_error = ""
        self._stream: StreamEnds | None = None
        self._parts: list[bytes] = []  # the answer's chunks as they came (decoded), within `_limit`
        self._size = 0
        self._limit = JSON_BODY_LIMIT
        self._body_overflow = False
        self._finished = False
        self._failure = ""
        self._left = False
        self._read: Reported | None = None  # the answer as read for tokens: once, for the log and the row

    @property
    def wants_request_body(self) -> bool:
        """Whether `request_body` keeps what it is given (the caller may skip building it otherwise)."""
        kept = self._kept_parts
        return kept is not None and kept[1]

    def request_body(self, body: bytes | bytearray) -> None:
        """The body as sent upstream (after filters)."""
        kept = self._kept_parts
        if kept is not None and kept[1] and len(body) <= self._capture_limit:
            self._request_body = body if type(body) is bytes else bytes(body)

    @property
    def answered(self) -> bool:
        """Whether the upstream's status (or a failure to get one, `fail`) is known."""
        return self._status is not None

    def fail(self, status: int, message: str) -> None:
        """The upstream could not be reached or broke off: `status` and `message` are the row's."""
        if self._status is None or self._status < 400:
            self._status = status
        self._failure = message

    def client_left(self) -> None:
        """The client went away during the answer: the row keeps the status it was sent, says the client
        left, and counts the tokens a stream had sent by then when no usage event came."""
        self._left = True
        self._failure = self._failure or CLIENT_LEFT

    def response_headers(self, status: int, headers: Mapping[str, str]) -> None:
        self._status = status
        self._raw_response_headers = headers  # redacted only if a capture is shown
        self._content_type = content_type = headers.get("Content-Type") or headers.get("content-type") or ""
        encoding = headers.get("Content-Encoding") or headers.get("content-encoding")
        if encoding:
            encoding = encoding.strip().lower()
            if encoding in _DECODABLE:
                self._decoder = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib, by its header
            elif encoding != "identity":
                self._decode_error = f"response content-encoding {encoding!r} is not read"
        if "text/event-stream" in content_type.lower():
            self._stream = StreamEnds()
            # A stream's tokens are read from its ends; its whole body is held only for a capture.
            kept = self._kept_parts
            self._limit = min(self._capture_limit * 4, STREAM_CAPTURE_LIMIT) if kept and kept[3] else 0

    def chunk(self, data: bytes) -> None:
        """Bytes of the answer as they went to the client."""
        if self._ttfb_ms is None:
            self._ttfb_ms = int((time.perf_counter() - self._started) * 1000)
        if self._decode_error:
            return
        if self._decoder is not None:
            try:
                data = self._decoder.decompress(data)
            except zlib.error as exc:
                self._decode_error = f"response decompression failed: {exc}"
                return
        if self._stream is not None:
            self._stream.feed(data)
        if self._body_overflow:
            return
        self._size += len(data)
        if self._size > self._limit:
            self._body_overflow = True
            self._parts.clear()
        else:
            self._parts.append(data)

    def finish(self, status: int | None = None, *, content_type: str | None = None, body: bytes | None = None,
               error: str = "") -> ActivityRecord | None:
        """End the recording, and keep its row (returned) and capture now. `status` defaults to the
        upstream's; `body`/`content_type` describe an answer llmswap made itself (an error before or instead
        of the upstream's); `error` overrides the message."""
        return self.settle() if self._end(status, content_type, body, error) else None

    def finish_soon(self, status: int | None = None, *, content_type: str | None = None,
                    body: bytes | None = None, error: str = "") -> None:
        """`finish`, with the row and capture kept a little later, together with other requests' (the
        recorder's `settle_soon`): the end is taken now, the answer read then."""
        if self._end(status, content_type, body, error):
            self._keeper.settle_soon(self)

    def cached_tokens(self) -> int | None:
        """Prompt tokens the upstream's answer says came from its cache (None: not said, or not a 2xx): a
        stream's ends are scanned, a whole answer read. For the access log, before the row is settled."""
        if not 200 <= (self._status or 0) < 300 or self._decode_error:
            return None
        if self._stream is not None:
            return cached_of(self._answer(None))
        if self._body_overflow or not self._parts:
            return None
        return cached_of(self._answer(self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)))

    def _answer(self, whole: bytes | None) -> Reported:
        """What the answer reported (its stream's ends, else `whole`), read once."""
        if self._read is None:
            self._read = self._stream.reported() if self._stream is not None else \
                read_json_answer(whole or b"", self.facts.req_path)
        return self._read

    @property
    def held(self) -> int:
        """Bytes of the answer held for reading and capture."""
        return 0 if self._body_overflow else self._size

    def _end(self, status: int | None, content_type: str | None, body: bytes | None, error: str) -> bool:
        """Take the end now (time, status, the answer made instead of the upstream's); False when ended
        before."""
        if self._finished:
            return False
        self._finished = True
        self._elapsed = time.perf_counter() - self._started
        self._end_status = status if status is not None else (self._status or 0)
        self._error = error
        if body is not None:
            self._parts, self._body_overflow, self._stream, self._read = [body], False, None, None
            self._content_type = content_type or self._content_type
        return True

    def settle(self) -> ActivityRecord:
        """The row and capture of an ended recording, read from what it was told, handed to the keeper."""
        elapsed = self._elapsed
        wall_ms = int(elapsed * 1000)
        status = self._end_status
        parts = self._parts
        whole = None if self._body_overflow else parts[0] if len(parts) == 1 else b"".join(parts)
        message = self._error or self._failure
        ok = status == 200 or status == 201
        if not ok:
            tokens, duration = NO_TOKENS, wall_ms
            message = message or error_message(status, whole)
        elif self._decode_error:
            tokens, duration = NO_TOKENS, wall_ms
            message = message or self._decode_error
        elif self._stream is not None:
            tokens, duration = token_stats(self._answer(None), wall_ms)
            if self._left and tokens.output_tokens <= 0:
                tokens = tokens._replace(output_tokens=self._stream.events)  # cut before its usage event
        elif whole:
            tokens, duration = token_stats(self._answer(whole), wall_ms)
        else:
            tokens, duration = NO_TOKENS, wall_ms
        facts = self.facts
        waited = self.record.waited
        load = self.record.load or 0.0
        queue_ms = None if waited is None else int((waited - load if waited > load else 0.0) * 1000)
        load_ms = int(load * 1000) if load else None
        phases, restore_ms = NO_PHASES, None
        if self.record.phases:
            summed: dict[str, int] = {}
            for name, seconds in self.record.phases:
                summed[name] = summed.get(name, 0) + int(seconds * 1000)
            phases, restore_ms = summed, summed.get("restore")
        # Positional, one line per group of ActivityRecord's fields in their order: keywords would cost
        # more than half of building it.
        record = ActivityRecord(
            self._keeper.next_id(), self.started + elapsed, facts.model, facts.req_path,  # id, timestamp...
            status, self._content_type, tokens, duration, message,  # resp_status_code ... error_msg
            dict(facts.metadata) if facts.metadata else NO_METADATA,  # metadata
            facts.requested_model or facts.model, facts.origin, facts.key_name,  # requested_model...
            self.started, queue_ms, load_ms, self._ttfb_ms,  # started, queue_ms, load_ms, ttfb_ms
            restore_ms, phases,  # restore_ms, phases
        )
        kept = self._kept_parts
        capture = None
        if kept is not None and not (ok and self._decode_error):
            # The capture as recorded: headers packed (`Capture.shown` redacts them), bodies as kept. A
            # failed answer's body is kept too (llama-swap drops it): it is what one opens a capture for.
            response_headers = self._raw_response_headers
            capture = Capture(record.id, facts.req_path, packed(facts.request_headers) if kept[0] else None,
                              self._request_body,
                              packed(response_headers) if kept[2] and response_headers is not None else None,
                              whole if kept[3] else None)
        self._keeper.keep(record, capture)
        return record
