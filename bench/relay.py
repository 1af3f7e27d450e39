"""Streaming relay: how fast llmswap passes on a server-sent-event stream that its upstream produces as fast
as it can, against the same stream read straight from the upstream in the same run.

The upstream is llmswap's demo with no token pacing, asked for one long chat completion stream; the two sides
alternate, several rounds each. Each side's figure is its median round (tokens/s and bytes/s); the ratio is
the median of the rounds' own ratios, each from two streams back to back.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench import proxy_overhead
from bench.launch import HOST, free_port, running_llmswap
from bench.report import Row, per_second, ratio


@dataclass(frozen=True)
class StreamTiming:
    """One streamed chat completion as the client saw it."""

    began: float
    first_token: float
    last_token: float
    tokens: int  # chunks that carried generated text
    size: int  # bytes of the response body

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / (self.last_token - self.began)

    @property
    def decode_tokens_per_second(self) -> float:
        """Tokens after the first over the time they took: generation speed, without prompt processing."""
        return (self.tokens - 1) / (self.last_token - self.first_token) if self.tokens > 1 else 0.0

    @property
    def bytes_per_second(self) -> float:
        return self.size / (self.last_token - self.began)


async def timed_stream(http: aiohttp.ClientSession, url: str, body: dict[str, object]) -> StreamTiming:
    """POST a streamed chat completion and note when each token arrives."""
    began = time.perf_counter()
    first = last = 0.0
    tokens = size = 0
    async with http.post(f"{url}/v1/chat/completions", json={**body, "stream": True}) as response:
        if response.status != 200:
            raise SystemExit(f"{url}: status {response.status}: {(await response.text())[:300]}")
        async for line in response.content:
            size += len(line)
            if not line.startswith(b"data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                last = time.perf_counter()
                first = first or last
                tokens += 1
    if not tokens:
        raise SystemExit(f"{url}: the stream carried no tokens")
    return StreamTiming(began, first, last, tokens, size)


async def alternate(http: aiohttp.ClientSession, urls: dict[str, str], body: dict[str, object],
                    rounds: int) -> dict[str, list[StreamTiming]]:
    """`rounds` streams per side, the sides taking turns (and swapping who goes first) so drift hits both."""
    timings: dict[str, list[StreamTiming]] = {side: [] for side in urls}
    for round_ in range(rounds):
        order = list(urls) if round_ % 2 == 0 else list(reversed(urls))
        for side in order:
            timings[side].append(await timed_stream(http, urls[side], body))
    return timings


def median_by_side(timings: dict[str, list[StreamTiming]],
                   measure: Callable[[StreamTiming], float]) -> dict[str, float]:
    return {side: statistics.median(measure(t) for t in runs) for side, runs in timings.items()}


def per_round_ratio(timings: dict[str, list[StreamTiming]]) -> float:
    """llmswap's tokens/s over direct's, the median of the rounds' own ratios: each round's two streams ran
    back to back, so their ratio is free of the drift between rounds."""
    return statistics.median(ours.tokens_per_second / theirs.tokens_per_second
                             for ours, theirs in zip(timings["llmswap"], timings["direct"], strict=True))


async def streaming_relay(tokens: int, rounds: int) -> list[Row]:
    body = {"model": proxy_overhead.MODEL, "max_tokens": tokens,
            "messages": [{"role": "user", "content": "go"}]}
    with tempfile.TemporaryDirectory() as folder:
        port = free_port()
        config = proxy_overhead.write_config(Path(folder), "demo", port, concurrency=1)
        direct = f"http://{HOST}:{port}"
        async with running_llmswap(config, [f"{direct}/health"]) as server, aiohttp.ClientSession() as http:
            urls = {"direct": direct, "llmswap": server.url}
            await alternate(http, urls, {**body, "max_tokens": 200}, rounds=1)  # warm-up
            timings = await alternate(http, urls, body, rounds)
    tokens_per_s = median_by_side(timings, lambda t: t.tokens_per_second)
    bytes_per_s = median_by_side(timings, lambda t: t.bytes_per_second)

    def both(side: str) -> str:
        return f"{per_second(tokens_per_s[side], 'tokens')} ({bytes_per_s[side] / 2**20:.1f} MiB/s)"

    return [Row(f"streaming relay: one {tokens:,}-token SSE stream, median of {rounds}",
                "direct to the upstream", both("direct"), both("llmswap"),
                ratio(per_round_ratio(timings), 1.0))]
