"""The request's record (`RequestRecord`): one value made by the middleware as a request arrives, handed to
its route, and from there down the path as an argument, written where each fact becomes known (the model
named, the wait, the load and its phases, the answer's first byte, the bytes relayed, a cut), and read once
as the request ends: for its access line and the request observers (metrics), and for its activity row.

A route takes it from the request once (`request_record`), at its entry; nothing below the route reaches
back for it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from aiohttp import web


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


# The record is a mutable object, so a cloned request (auth clones to drop credentials) shares it with
# the original the middleware holds.
RECORD: web.RequestKey[RequestRecord] = web.RequestKey("llmswap_record", RequestRecord)


def request_record(request: web.BaseRequest) -> RequestRecord:
    """The request's record, for its route to hand down (a request the middleware did not frame, as in a
    test calling a route directly, gets a fresh one that nothing reads)."""
    record = request.get(RECORD)
    return record if isinstance(record, RequestRecord) else RequestRecord(started=time.monotonic())
