"""Request and response captures of recent requests, compressed, in a ring bounded by bytes.

A capture holds the headers (credentials redacted) and bodies one request sent upstream and got back,
keyed by its activity id. The ring keeps the newest captures whose compressed sizes fit `captureBuffer`
MiB; adding one evicts the oldest until it fits, and one larger than the whole budget is not kept.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

MIB = 1024 * 1024
REDACTED = "[REDACTED]"
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key"})
# Fast, as this runs on the event loop as each request ends: level 1 with a 4 KiB window and a small
# match table costs a few microseconds for a typical chat, where zlib's defaults cost ten times more
# (mostly setting up their larger tables).
_COMPRESSION_LEVEL = 1
_WINDOW_BITS = 12
_MEMORY_LEVEL = 4

# What each route keeps (request headers, request body, response headers, response body): media bodies are
# large and of little use when reading activity, as llama-swap decides too.
_ALL = (True, True, True, True)
_PARTS: dict[str, tuple[bool, bool, bool, bool]] = {
    "/v1/audio/speech": (True, True, True, False),
    "/v1/audio/voices": (True, False, True, True),
    "/v1/audio/transcriptions": (True, False, True, True),
    "/v1/images/generations": (True, True, True, False),
    "/sdapi/v1/txt2img": (True, True, True, False),
    "/v1/images/edits": (True, False, True, False),
    "/sdapi/v1/img2img": (True, False, True, False),
}


def parts_for(path: str) -> tuple[bool, bool, bool, bool]:
    return _PARTS.get(path, _ALL)


Headers = Mapping[str, str] | str  # a mapping, or `packed`: its `name: value` lines


def packed(headers: Mapping[str, str]) -> Headers:
    """`headers` as one string of `name: value` lines, what a capture keeps: one object instead of a
    mapping and two strings a header, which held by thousands of captures slow every request down (the
    memory they keep is memory the next requests do not reuse while it is warm). The mapping itself when a
    value holds a line break (no parser lets one through; this keeps such a capture right anyway)."""
    text = "\n".join(map(": ".join, headers.items()))
    return text if text.count("\n") == len(headers) - 1 or not headers else headers


def _items(headers: Headers) -> Iterable[tuple[str, str]]:
    if not isinstance(headers, str):
        return headers.items()
    return (tuple(line.split(": ", 1)) for line in headers.split("\n")) if headers else ()  # type: ignore[misc]


def redacted(headers: Headers) -> dict[str, str]:
    """The first value of each header, credentials replaced by `[REDACTED]`."""
    shown: dict[str, str] = {}
    for name, value in _items(headers):
        if name not in shown:
            shown[name] = REDACTED if name.lower() in SECRET_HEADERS else value
    return shown


def shown_response_headers(headers: Headers) -> dict[str, str]:
    """Response headers as a capture shows them: redacted, and without Content-Encoding (the body is kept
    decoded)."""
    return {name: value for name, value in redacted(headers).items() if name.lower() != "content-encoding"}


class Capture(NamedTuple):
    """One request's capture. As recorded, the headers are as the request and the answer came with them,
    `packed`; `shown` is what leaves the ring: plain dicts, credentials redacted. A named tuple: immutable,
    and cheap to build (one is built per request)."""

    id: int
    req_path: str
    req_headers: Headers | None
    req_body: bytes | None
    resp_headers: Headers | None
    resp_body: bytes | None

    def shown(self) -> Capture:
        """This capture with its headers as shown: plain dicts, credentials redacted (idempotent)."""
        return Capture(
            id=self.id, req_path=self.req_path,
            req_headers=None if self.req_headers is None else redacted(self.req_headers),
            req_body=self.req_body,
            resp_headers=None if self.resp_headers is None else shown_response_headers(self.resp_headers),
            resp_body=self.resp_body,
        )

    def as_dict(self) -> dict[str, Any]:
        """llama-swap's shape: bodies as base64 strings (as Go encodes byte slices)."""
        shown = self.shown()
        return {
            "id": shown.id, "req_path": shown.req_path, "req_headers": shown.req_headers,
            "req_body": _b64(shown.req_body), "resp_headers": shown.resp_headers,
            "resp_body": _b64(shown.resp_body),
        }

    def compress(self) -> bytes:
        """Raw deflate of: 4-byte length, JSON of all but the bodies (headers as shown), then the bodies as
        they are."""
        shown = self.shown()
        meta = {"id": self.id, "req_path": self.req_path, "req_headers": shown.req_headers,
                "resp_headers": shown.resp_headers,
                "req_len": None if self.req_body is None else len(self.req_body),
                "resp_len": None if self.resp_body is None else len(self.resp_body)}
        head = json.dumps(meta, separators=(",", ":")).encode()
        packer = zlib.compressobj(_COMPRESSION_LEVEL, zlib.DEFLATED, -_WINDOW_BITS, _MEMORY_LEVEL)
        parts = [packer.compress(len(head).to_bytes(4, "little")), packer.compress(head)]
        parts += [packer.compress(body) for body in (self.req_body, self.resp_body) if body]
        parts.append(packer.flush())
        return b"".join(parts)

    @staticmethod
    def decompress(blob: bytes) -> Capture:
        raw = zlib.decompress(blob, -zlib.MAX_WBITS)
        size = int.from_bytes(raw[:4], "little")
        meta = json.loads(raw[4 : 4 + size])
        position = 4 + size
        bodies: list[bytes | None] = []
        for length in (meta["req_len"], meta["resp_len"]):
            bodies.append(None if length is None else raw[position : position + length])
            position += length or 0
        return Capture(id=int(meta["id"]), req_path=str(meta["req_path"]), req_headers=meta["req_headers"],
                       req_body=bodies[0], resp_headers=meta["resp_headers"], resp_body=bodies[1])


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


# A capture whose bodies and headers hold fewer bytes than this is kept as it is: compressing a few
# hundred bytes saves little and costs the most per request (most chat requests are this small).
SMALL_CAPTURE = 4096
_ENTRY_OVERHEAD = 256  # what an uncompressed entry's objects cost beyond its bytes, roughly


def raw_size(capture: Capture) -> int:
    """Bytes a capture holds before compression (bodies, headers, a rough allowance for the objects)."""
    size = _ENTRY_OVERHEAD
    if capture.req_body:
        size += len(capture.req_body)
    if capture.resp_body:
        size += len(capture.resp_body)
    for headers in (capture.req_headers, capture.resp_headers):
        if isinstance(headers, str):
            size += len(headers)
        elif headers:
            size += len("".join(headers.keys())) + len("".join(headers.values()))
    return size


class CaptureRing:
    """Captures by activity id, oldest first, within `budget` bytes (0 = captures off); all but small ones
    compressed. Each entry is kept with the size it was counted at, so evicting costs no recount."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._blobs: OrderedDict[int, tuple[bytes | Capture, int]] = OrderedDict()
        self.size = 0

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def __contains__(self, activity_id: int) -> bool:
        return activity_id in self._blobs

    def __len__(self) -> int:
        return len(self._blobs)

    def add(self, capture: Capture, raw: int | None = None) -> bool:
        """Keep `capture` (`raw`: its `raw_size` when known), evicting the oldest as needed; False when it is
        larger than the whole ring."""
        if self.budget <= 0:
            return False
        if raw is None:
            raw = raw_size(capture)
        if raw <= SMALL_CAPTURE:
            return self._insert(capture.id, capture, raw)
        return self.add_compressed(capture.id, capture.compress())

    def add_compressed(self, activity_id: int, blob: bytes) -> bool:
        """`add` for a capture compressed elsewhere (a large one, on a worker thread)."""
        return self.enabled and self._insert(activity_id, blob, len(blob))

    def _insert(self, activity_id: int, entry: bytes | Capture, size: int) -> bool:
        if size > self.budget:
            return False
        blobs = self._blobs
        if activity_id in blobs:
            self.size -= blobs.pop(activity_id)[1]
        held = self.size + size
        while blobs and held > self.budget:
            held -= blobs.popitem(last=False)[1][1]
        blobs[activity_id] = (entry, size)
        self.size = held
        return True

    def get(self, activity_id: int) -> Capture | None:
        """The capture as shown (credentials redacted)."""
        kept = self._blobs.get(activity_id)
        if kept is None:
            return None
        entry = kept[0]
        if isinstance(entry, Capture):
            return entry.shown()
        return Capture.decompress(entry)
