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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MIB = 1024 * 1024
REDACTED = "[REDACTED]"
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key"})
_COMPRESSION_LEVEL = 1  # fast: this runs on the event loop as each request ends

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


def redacted(headers: Mapping[str, str]) -> dict[str, str]:
    """The first value of each header, credentials replaced by `[REDACTED]`."""
    shown: dict[str, str] = {}
    for name, value in headers.items():
        if name not in shown:
            shown[name] = REDACTED if name.lower() in SECRET_HEADERS else value
    return shown


@dataclass(frozen=True)
class Capture:
    id: int
    req_path: str
    req_headers: dict[str, str] | None
    req_body: bytes | None
    resp_headers: dict[str, str] | None
    resp_body: bytes | None

    def as_dict(self) -> dict[str, Any]:
        """llama-swap's shape: bodies as base64 strings (as Go encodes byte slices)."""
        return {
            "id": self.id, "req_path": self.req_path, "req_headers": self.req_headers,
            "req_body": _b64(self.req_body), "resp_headers": self.resp_headers,
            "resp_body": _b64(self.resp_body),
        }

    def compress(self) -> bytes:
        document = {**self.as_dict()}
        return zlib.compress(json.dumps(document, separators=(",", ":")).encode(), _COMPRESSION_LEVEL)

    @staticmethod
    def decompress(blob: bytes) -> Capture:
        document = json.loads(zlib.decompress(blob))
        return Capture(
            id=int(document["id"]), req_path=str(document["req_path"]), req_headers=document["req_headers"],
            req_body=_unb64(document["req_body"]), resp_headers=document["resp_headers"],
            resp_body=_unb64(document["resp_body"]),
        )


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


class CaptureRing:
    """Compressed captures by activity id, oldest first, within `budget` bytes (0 = captures off)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._blobs: OrderedDict[int, bytes] = OrderedDict()
        self.size = 0

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def __contains__(self, activity_id: int) -> bool:
        return activity_id in self._blobs

    def __len__(self) -> int:
        return len(self._blobs)

    def add(self, capture: Capture) -> bool:
        """Keep `capture`, evicting the oldest as needed; False when it is larger than the whole ring."""
        if not self.enabled:
            return False
        blob = capture.compress()
        if len(blob) > self.budget:
            return False
        old = self._blobs.pop(capture.id, None)
        if old is not None:
            self.size -= len(old)
        while self._blobs and self.size + len(blob) > self.budget:
            _, evicted = self._blobs.popitem(last=False)
            self.size -= len(evicted)
        self._blobs[capture.id] = blob
        self.size += len(blob)
        return True

    def get(self, activity_id: int) -> Capture | None:
        blob = self._blobs.get(activity_id)
        return None if blob is None else Capture.decompress(blob)
