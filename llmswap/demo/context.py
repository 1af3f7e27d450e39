"""The demo server's shared object: its options, live counters, and how it writes and paces answers."""

import asyncio
import dataclasses
import itertools
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass

from aiohttp import web

from llmswap.demo.options import DemoOptions
from llmswap.demo.received import Received
from llmswap.demo.replies import BadRequest
from llmswap.demo.sleep_api import Sleep
from llmswap.demo.text import DEFAULT_MAX_TOKENS, answer_tokens, count_tokens

# An answer is built whole before it is sent; this keeps a typo in max_tokens from eating the machine.
MAX_TOKENS_LIMIT = 100_000


@dataclass
class DemoState:
    """What the demo is doing now; shown under "demo" at GET /props."""

    healthy: bool = False
    first_health_reported: bool = False
    requests: int = 0
    generations_in_progress: int = 0
    tokens_generated: int = 0
    # The close code of each /ws client that closed its socket.
    socket_close_codes: list[int] = dataclasses.field(default_factory=list)
    slot_tokens: int = 0  # the prompt tokens its one slot holds (llama-server's `n_prompt_tokens`)


@dataclass(frozen=True)
class TokenLimit:
    count: int
    requested: bool  # the client set the limit, so reaching it is finish reason "length", not "stop"


class Demo:
    """One demo server: who it pretends to be, what it is doing, and how its answers are written and paced."""

    def __init__(self, options: DemoOptions, state: DemoState | None = None) -> None:
        self.options = options
        self.state = state or DemoState()
        self.sleep: Sleep | None = None  # with --enable-sleep-mode (llmswap.demo.sleep_api)
        self._ids = itertools.count(1)

    @property
    def name(self) -> str:
        return self.options.model_name

    def next_id(self, prefix: str) -> str:
        return f"{prefix}-demo-{next(self._ids)}"

    async def process_prompt(self, prompt: str) -> None:
        """The prompt goes into the slot: at `--prompt-per-second`, paced (what `timings` then reports)."""
        tokens = count_tokens(prompt)
        self.state.slot_tokens = tokens
        if self.options.prompt_per_second > 0:
            await asyncio.sleep(tokens / self.options.prompt_per_second)

    def answer(self, prompt: str, limit: TokenLimit) -> list[str]:
        return answer_tokens(self.name, prompt, limit.count)

    async def generate(self, tokens: list[str]) -> AsyncGenerator[str, None]:
        """Yield the tokens at --tokens-per-second. Use it under ``aclosing`` so that a client leaving
        mid-stream ends the generation at once and the in-progress count stays true."""
        loop = asyncio.get_running_loop()
        rate = self.options.tokens_per_second
        started = loop.time()
        self.state.generations_in_progress += 1
        try:
            for index, token in enumerate(tokens):
                if rate > 0:
                    # An absolute schedule, so a slow client or a busy machine does not stretch the pace.
                    delay = started + (index + 1) / rate - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                self.state.tokens_generated += 1
                yield token
        finally:
            self.state.generations_in_progress -= 1

    async def generate_all(self, tokens: list[str]) -> str:
        parts = [token async for token in self.generate(tokens)]
        return "".join(parts)

    def with_echo(self, received: Received, payload: Mapping[str, object]) -> dict[str, object]:
        return {**payload, "echo": received.echo()} if self.options.echo else dict(payload)

    def reply(self, received: Received, payload: Mapping[str, object], status: int = 200) -> web.Response:
        return web.json_response(self.with_echo(received, payload), status=status)


def created() -> int:
    return int(time.time())


def json_object(received: Received) -> dict[str, object]:
    """The body as a JSON object, or a BadRequest saying what arrived instead."""
    if isinstance(received.body, dict):
        return received.body
    if received.body_error:
        raise BadRequest(received.body_error)
    kind = "an empty body" if received.body is None else f"a JSON {type(received.body).__name__}"
    raise BadRequest(f"{received.path} needs a JSON object body, got {kind}")


def token_limit(body: Mapping[str, object], *fields: str) -> TokenLimit:
    """The first of ``fields`` the client set (OpenAI, llama.cpp and Anthropic spell it differently)."""
    for field in fields:
        value = body.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS_LIMIT:
            raise BadRequest(f"{field} must be an integer from 0 to {MAX_TOKENS_LIMIT}, got {value!r}")
        return TokenLimit(value, requested=True)
    return TokenLimit(DEFAULT_MAX_TOKENS, requested=False)


def requested_model(demo: Demo, body: Mapping[str, object]) -> str:
    """Responses name the model the client asked for, as a real server behind a proxy would."""
    model = body.get("model")
    return model if isinstance(model, str) and model else demo.name


def string_field(body: Mapping[str, object], field: str) -> str:
    value = body.get(field)
    if value is None:
        raise BadRequest(f"{field} is required: a string")
    if not isinstance(value, str):
        raise BadRequest(f"{field} must be a string, got {value!r}")
    return value


def is_streaming(body: Mapping[str, object]) -> bool:
    return body.get("stream") is True
