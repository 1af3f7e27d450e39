"""A task's or a batch request's call to its model, recorded in activity like an HTTP request.

The task queue posts whole JSON bodies and reads whole answers (`post_json`); the recording sees the body
sent, the status, headers and answer, so token counts and speeds come out as for any request.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import aiohttp

from llmswap.activity.recorder import ActivityRecorder
from llmswap.activity.recording import Recording, RequestFacts


def begin(recorder: ActivityRecorder | None, *, model: str, requested: str, path: str,
          origin: str) -> Recording | None:
    if recorder is None:
        return None
    return recorder.begin(RequestFacts(model=model, req_path=path, requested_model=requested, origin=origin))


class Waiting:
    """Times the wait for a model grant, for the recording's queue wait."""

    def __init__(self) -> None:
        self.asked = time.monotonic()

    def granted(self, recording: Recording | None) -> None:
        if recording is not None:
            recording.waited(time.monotonic() - self.asked)


async def post_json(session: aiohttp.ClientSession, url: str, body: Mapping[str, Any],
                    recording: Recording | None) -> tuple[int, str]:
    """POST `body` as JSON; (status, text). A transport failure is recorded, then raised."""
    data = json.dumps(body).encode()
    if recording is not None and recording.wants_request_body:
        recording.request_body(data)
    try:
        async with session.post(url, data=data, headers={"Content-Type": "application/json"}) as response:
            raw = await response.read()
            status = response.status
            if recording is not None:
                recording.response_headers(status, response.headers)
                recording.chunk(raw)
    except BaseException as exc:
        if recording is not None:
            recording.fail(502, f"{type(exc).__name__}: {exc}".rstrip(": "))
            recording.finish()
        raise
    if recording is not None:
        recording.finish()
    return status, raw.decode("utf-8", errors="replace")
