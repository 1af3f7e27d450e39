"""A swap phase by phase, with real processes: a real llmswap and demo upstreams, one model at a time.

`a` streams slowly, so a request for `b` waits for it to drain; `b`'s command names a file standing for its
weights, which its server reads whole before it is healthy. While `a` drains, llmswap reads that file into
the page cache (checked with mincore, never with a clock); the swap's phases reach the access line, the
metrics and the events. A prefetch is cancelled with the request that wanted it, and a file larger than
the host's room is skipped.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from tests.helpers.cli import LlmswapProcess, demo_model, running_llmswap, write_config
from tests.helpers.pagecache import drop, resident_fraction
from tests.helpers.wait import eventually

MIB = 1 << 20
SLOW = ("--tokens-per-second", "20")


def chat_body(model: str, tokens: int = 3, stream: bool = False) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens,
            "stream": stream}


async def chat(server: LlmswapProcess, model: str) -> int:
    async with aiohttp.ClientSession() as http, http.post(f"{server.url}/v1/chat/completions",
                                                           json=chat_body(model)) as response:
        await response.read()
        return response.status


def lines(server: LlmswapProcess, text: str) -> list[str]:
    return [line for line in server.stdout_lines + server.stderr_lines if text in line]


async def wait_line(server: LlmswapProcess, text: str) -> str:
    async def printed() -> bool:
        return bool(lines(server, text))

    await eventually(printed, what=f"a line with {text!r}")
    return lines(server, text)[0]


async def test_the_next_model_is_read_while_the_last_one_drains_and_the_swap_names_its_phases(
        tmp_path: Path) -> None:
    weights = tmp_path / "b-weights.bin"
    weights.write_bytes(bytes(range(256)) * (64 * MIB // 256))
    drop(weights)
    assert resident_fraction(weights) < 0.5
    models = {"a": demo_model("a", *SLOW), "b": demo_model("b", "--weights", str(weights))}
    async with running_llmswap(write_config(tmp_path / "config.yaml", models, logLevel="info")) as server, \
            aiohttp.ClientSession() as http:
        assert await chat(server, "a") == 200
        async with http.post(f"{server.url}/v1/chat/completions", json=chat_body("a", 60, stream=True)) as a:
            await a.content.readline()  # a serves
            asked_b = asyncio.create_task(chat(server, "b"))

            async def read_ahead() -> bool:
                return resident_fraction(weights) > 0.95

            await eventually(read_ahead, what="b's weights in the page cache")
            # Read during the drain: a still streams, and b's server has not been started.
            assert not a.content.at_eof() and "b" not in server.upstreams()
            await a.read()
        assert await asked_b == 200
        line = await wait_line(server, "model=b ")
        assert " phases=drain:" in line and ",stop:" in line and ",prefetch:" in line and ",start:" in line
        assert ",save:" not in line and ",restore:" not in line  # no kvCache: nothing saved or restored
        swap_line = await wait_line(server, "swap: b ready in")
        assert "drain:" in swap_line and "prefetch:" in swap_line
        async with http.get(f"{server.url}/metrics") as response:
            metrics = await response.text()
        for phase, model in (("drain", "a"), ("stop", "a"), ("prefetch", "b"), ("start", "b")):
            assert f'llmswap_swap_phase_seconds_count{{model="{model}",phase="{phase}"}} 1.0' in metrics
        assert 'phase="restore"' not in metrics and 'phase="save"' not in metrics
        async with http.get(f"{server.url}/api/metrics/activity") as response:
            rows = (await response.json())["data"]
        row = next(r for r in rows if r["model"] == "b")
        assert set(row["phases_ms"]) == {"drain", "stop", "prefetch", "start"}


async def test_a_prefetch_ends_with_the_request_that_wanted_it_and_skips_what_does_not_fit(
        tmp_path: Path) -> None:
    slow_read = tmp_path / "c-projector.bin"  # sparse: read at memory speed, long enough to be cut
    with slow_read.open("wb") as file:
        file.truncate(1024 * MIB)
    too_large = tmp_path / "d-projector.bin"
    with too_large.open("wb") as file:
        file.truncate(psutil.virtual_memory().total)  # never fits beside a tenth of the host's memory
    models = {"a": demo_model("a", *SLOW), "c": demo_model("c", "--mmproj", str(slow_read)),
              "d": demo_model("d", "--mmproj", str(too_large))}
    async with running_llmswap(write_config(tmp_path / "config.yaml", models, logLevel="info")) as server, \
            aiohttp.ClientSession() as http:
        assert await chat(server, "a") == 200
        async with http.post(f"{server.url}/v1/chat/completions", json=chat_body("a", 40, stream=True)) as a:
            await a.content.readline()
            asked_c = asyncio.create_task(chat(server, "c"))  # waits for a's drain; c's files are read
            await asyncio.sleep(0.3)
            asked_c.cancel()  # the client leaves: no swap to c will come
            await asyncio.gather(asked_c, return_exceptions=True)
            await wait_line(server, "[c] prefetch: cancelled")
            await a.read()
        assert "c" not in server.upstreams()
        assert resident_fraction(slow_read) < 0.9  # not read to the end

        async with http.post(f"{server.url}/api/models/load/d") as response:  # a load prefetches too
            assert response.status == 200, await response.text()
        skipped = await wait_line(server, "[d] prefetch: skipped")
        assert f"{too_large}: {psutil.virtual_memory().total >> 20} MiB would not fit" in skipped
        assert resident_fraction(too_large) < 0.01
        swap_line = await wait_line(server, "swap: d ready in")
        assert "(evicted a, rule" in swap_line and "drain:" not in swap_line  # nothing was in flight on a
