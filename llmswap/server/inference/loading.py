"""Loading feedback (`sendLoadingState`): what a streaming client reads while its model loads.

After admission, a streaming request whose model is not ready gets its 200 event-stream headers at once and
a running commentary until the grant: a banner naming the model, its queue position when it changes, a dot
per tick, an occasional remark, then `Done! (1.23s)` — llama-swap's text (reference 5.9). The upstream's own
stream then follows in the same response.

Each API family gets the commentary in a shape its clients parse without tripping (`StreamDialect`):
- chat completions: `delta.reasoning_content` chunks, as llama-swap sends (UIs show it as thinking);
- text completions and llama.cpp's /completion, /infill: chunks with empty text and the commentary in a
  `reasoning_content` field, so the generated text stays clean;
- Anthropic /v1/messages: SSE comments plus a `ping` event per tick. A chat-completions chunk would be
  meaningless there; `ping` is the event Anthropic's own streams use to keep a connection alive, and SDKs
  skip it (and comments) by design. Errors use Anthropic's `event: error` shape;
- everything else (responses, audio, images...): SSE comments only, which every SSE parser ignores.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from llmswap.router.types import LoadProgress
from llmswap.server.inference.proxy import SseErrorFormatter, openai_sse_error

RULE = "━━━━━"
TICK = 0.75  # seconds between progress marks
CHARS_PER_SECOND = 75.0  # typing speed of the commentary
CHUNK_RUNES = 5  # characters per event while typing
FIRST_REMARK_DELAY = 0.0  # the first tick makes a remark, like llama-swap's
REMARK_EVERY = (5.0, 9.0)  # seconds between later remarks, drawn uniformly
PROGRESS_EVERY = 4  # ticks between progress estimates (`~40%`), when the model's load time is known

REMARKS: tuple[str, ...] = (
    "Warming up the weights",
    "Convincing the GPU this is a good idea",
    "Unpacking tensors, one layer at a time",
    "Counting parameters, please hold",
    "Waking the attention heads gently",
    "Filling the KV cache with good intentions",
    "Moving gigabytes so you do not have to",
    "Quantized, yet still heavy",
    "Nearly there, probably",
    "Teaching the tokenizer your language",
    "Stretching before the first token",
    "Checking the model read its config",
)


# -------------------------------------------------------------------------------- dialects


@dataclass(frozen=True)
class StreamDialect:
    """How commentary, keep-alives and errors are written into one API family's event stream."""

    name: str
    text: Callable[[str, str], bytes]  # (model as requested, piece of commentary) → SSE bytes
    tick: Callable[[], bytes]  # sent once per tick in addition to the text (b"" for none)
    error: SseErrorFormatter


def _event(payload: object, event: str | None = None) -> bytes:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return (f"event: {event}\n" if event else "").encode() + f"data: {data}\n\n".encode()


def _chat_text(model: str, piece: str) -> bytes:
    choice = {"index": 0, "delta": {"reasoning_content": piece}, "finish_reason": None}
    chunk = {"id": "llmswap-loading", "object": "chat.completion.chunk", "created": int(time.time()),
             "model": model, "choices": [choice]}
    return _event(chunk)


def _completion_text(model: str, piece: str) -> bytes:
    choice = {"index": 0, "text": "", "reasoning_content": piece, "logprobs": None, "finish_reason": None}
    chunk = {"id": "llmswap-loading", "object": "text_completion", "created": int(time.time()),
             "model": model, "choices": [choice]}
    return _event(chunk)


def _llamacpp_text(model: str, piece: str) -> bytes:
    return _event({"content": "", "reasoning_content": piece, "stop": False})


def comment(piece: str) -> bytes:
    """Text as SSE comment lines (`: ...`): carried to the client, ignored by every SSE parser."""
    return "".join(f": {line}\n" for line in piece.split("\n")).encode() + b"\n"


def _comment_text(model: str, piece: str) -> bytes:
    return comment(piece)


def _no_tick() -> bytes:
    return b""


def _anthropic_ping() -> bytes:
    return _event({"type": "ping"}, "ping")


_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_sse_error(status: int, message: str) -> bytes:
    """An error inside an Anthropic stream: `event: error` with Anthropic's error object (SDKs raise it)."""
    kind = _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
    return _event({"type": "error", "error": {"type": kind, "message": message}}, "error")


CHAT = StreamDialect("chat", _chat_text, _no_tick, openai_sse_error)
COMPLETION = StreamDialect("completion", _completion_text, _no_tick, openai_sse_error)
LLAMACPP = StreamDialect("llamacpp", _llamacpp_text, _no_tick, openai_sse_error)
ANTHROPIC = StreamDialect("anthropic", _comment_text, _anthropic_ping, anthropic_sse_error)
GENERIC = StreamDialect("generic", _comment_text, _no_tick, openai_sse_error)

_BY_PATH = {
    "/v1/chat/completions": CHAT,
    "/v/chat/completions": CHAT,
    "/v1/completions": COMPLETION,
    "/v/completions": COMPLETION,
    "/completion": LLAMACPP,
    "/infill": LLAMACPP,
    "/v1/messages": ANTHROPIC,
    "/v/messages": ANTHROPIC,
    "/v1/messages/count_tokens": ANTHROPIC,
    "/v/messages/count_tokens": ANTHROPIC,
}


def dialect_for(path: str) -> StreamDialect:
    """The dialect of the route a client called (its path as llmswap received it)."""
    return _BY_PATH.get(path, GENERIC)


# -------------------------------------------------------------------------------- commentary


def pieces(text: str, size: int = CHUNK_RUNES) -> list[str]:
    """`text` cut into pieces of at most `size` characters (code points, so no character is split)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


class LoadingFeedback:
    """The commentary of one waiting request: `start()` when admitted, `set_position()` as the queue moves,
    then exactly one of `finish()` (granted: returns the prepared response for the upstream's stream),
    `fail()` (the wait ended in an error) or `abandon()` (the client left)."""

    def __init__(
        self,
        request: web.Request,
        model_id: str,
        requested: str,
        dialect: StreamDialect,
        *,
        position: int = 0,
        progress: Callable[[], LoadProgress | None] | None = None,
        tick: float = TICK,
        chars_per_second: float = CHARS_PER_SECOND,
        rng: random.Random | None = None,
    ) -> None:
        self.request = request
        self.model_id = model_id
        self.requested = requested
        self.dialect = dialect
        self.response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            },
        )
        self._tick = tick
        self._chars_per_second = chars_per_second
        self._rng = rng or random.Random()
        self._remarks = list(REMARKS)
        self._rng.shuffle(self._remarks)
        self._pending_position = position or None
        self._progress = progress
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._started_at = time.monotonic()

    def start(self) -> None:
        """Send the headers and begin the commentary (in a task: the caller goes on waiting)."""
        if self._task is None:
            self._started_at = time.monotonic()
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"loading:{self.model_id}")

    def set_position(self, position: int) -> None:
        self._pending_position = position

    async def finish(self) -> web.StreamResponse:
        """The model is granted: end the commentary with `Done!` and hand over the response."""
        await self._stop_commentary()
        elapsed = time.monotonic() - self._started_at
        for piece in ("\n", f"Done! ({elapsed:.2f}s)\n", f"{RULE}\n", " \n"):
            await self._send(piece)
        return self.response

    async def fail(self, status: int, message: str) -> web.StreamResponse:
        """The wait ended in an error: the 200 is already sent, so the error is the stream's last event."""
        try:
            await self._stop_commentary()
            await self.response.write(self.dialect.error(status, message))
            await self.response.write_eof()
        except ConnectionError:
            pass
        return self.response

    async def abandon(self) -> None:
        """Stop writing (the client left, or the request ended another way); safe to call more than once."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _stop_commentary(self) -> None:
        if self._task is None:
            self.start()
        assert self._task is not None
        self._stop.set()
        # The task prepares the response; it must have finished (and its failure, a client gone, surface)
        # before anyone else writes.
        await self._task

    async def _send(self, piece: str) -> None:
        await self.response.write(self.dialect.text(self.requested, piece))

    async def _run(self) -> None:
        await self.response.prepare(self.request)
        await self._send(f"{RULE}\n")
        await self._send(f"llmswap loading model: {self.model_id}\n")
        remark_index = 0
        ticks = 0
        next_remark_at = time.monotonic() + FIRST_REMARK_DELAY
        while not await self._wait(self._tick):
            ticks += 1
            heartbeat = self.dialect.tick()
            if heartbeat:
                await self.response.write(heartbeat)
            position, self._pending_position = self._pending_position, None
            if position is not None:
                await self._send("\n")
                await self._type(f"Queue position: #{position}")
                await self._send(" ")
                next_remark_at = time.monotonic() + self._rng.uniform(*REMARK_EVERY)
            elif time.monotonic() >= next_remark_at:
                await self._send("\n")
                await self._type(self._remarks[remark_index % len(self._remarks)])
                await self._send(" ")
                remark_index += 1
                next_remark_at = time.monotonic() + self._rng.uniform(*REMARK_EVERY)
            elif (estimate := self._estimate(ticks)) is not None:
                await self._send(estimate)
            else:
                await self._send(".")

    def _estimate(self, ticks: int) -> str | None:
        """Every `PROGRESS_EVERY` ticks, how far the load is by the model's measured load times (` ~40%`)."""
        if self._progress is None or ticks % PROGRESS_EVERY:
            return None
        progress = self._progress()
        fraction = progress.fraction if progress is not None else None
        if progress is None or fraction is None or progress.expected is None:
            return None
        return f" ~{fraction * 100:.0f}% (loads take ~{progress.expected:.1f}s) "

    async def _type(self, text: str) -> None:
        """Send `text` a few characters at a time at typing speed; the rest is dropped once stopped."""
        parts = pieces(text)
        rate = self._chars_per_second
        for index, part in enumerate(parts):
            await self._send(part)
            last = index == len(parts) - 1
            if not last and rate > 0 and await self._wait(len(part) / rate):
                return

    async def _wait(self, seconds: float) -> bool:
        """Sleep `seconds`; True as soon as the commentary is asked to stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
        return self._stop.is_set()
