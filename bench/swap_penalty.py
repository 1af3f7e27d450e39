"""What swaps cost agents: two or three agents, each bound to its own model, in conversations whose prompts
grow turn by turn, one model loaded at a time, so every turn swaps. Real llama-server upstreams on generated
GGUF models (tests/helpers/gguf_model.py); nothing is downloaded.

    python -m bench.swap_penalty [--agents 3] [--turns 4] [--words 1200]

Sides, in the same run and on the same conversations (greedy decoding: every side gets the same answers):
- llmswap with `kvCache: false` (the baseline: what every proxy does, the prompt is processed again);
- llmswap with `kvCache: true` (slots saved before the swap away, restored after the swap back);
- llama.cpp's own router mode (`llama-server --models-dir DIR --models-max 1`), when llama-server is here;
- llama-swap (`../shared/bin/llama-swap` beside the repository, else one on PATH; its config is llmswap's
  without `kvCache`).

Rows: total time, time to first token of the turns that followed a swap (p50 and max), and prompt tokens
processed again (tokens of the conversation the model had seen at its previous turn, computed anew rather
than taken from a cache), each against the kvCache-off baseline. Needs llama-server
(.ci/install-llama-server.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.launch import HOST, find_llama_swap, free_port, running_llmswap, running_process
from bench.report import Row, markdown_table, ms, ratio
from bench.report import machine as describe_machine

CONTEXT = 8192  # per model: the longest conversation at the default scale stays below it
ANSWER_TOKENS = 16


@dataclass
class Turn:
    seconds: float
    first_token: float
    processed: int  # prompt tokens the server computed
    cached: int  # prompt tokens it took from its cache
    swapped: bool  # the model before this turn was another one
    seen: int  # prompt tokens of this conversation the server had seen before (its last prompt and answer)

    @property
    def again(self) -> int:
        """Prompt tokens computed although the model had seen them: what a lost KV cache costs."""
        return max(0, min(self.processed, self.seen - self.cached))


@dataclass
class Side:
    name: str
    turns: list[Turn] = field(default_factory=list)
    total: float = 0.0

    @property
    def after_swap(self) -> list[float]:
        return [turn.first_token for turn in self.turns if turn.swapped]

    @property
    def processed(self) -> int:
        return sum(turn.processed for turn in self.turns)

    @property
    def again(self) -> int:
        return sum(turn.again for turn in self.turns)

    @property
    def prompt_tokens(self) -> int:
        return sum(turn.processed + turn.cached for turn in self.turns)


def words(count: int, seed: int) -> str:
    from tests.helpers.gguf_model import words as picked  # the generator needs numpy and gguf (test extra)

    return picked(count, seed)


async def ask(http: aiohttp.ClientSession, url: str, model: str, messages: list[dict[str, str]]
              ) -> tuple[str, float, float, dict[str, int]]:
    """One streamed turn: the answer, seconds to its first token and to its end, and the server's timings."""
    payload = {"model": model, "messages": messages, "max_tokens": ANSWER_TOKENS, "temperature": 0,
               "seed": 1, "stream": True}
    began = time.monotonic()
    first = 0.0
    text: list[str] = []
    timings: dict[str, int] = {}
    async with http.post(f"{url}/v1/chat/completions", json=payload) as response:
        if response.status != 200:
            raise SystemExit(f"{model}: {response.status} {await response.text()}")
        async for raw in response.content:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            for choice in event.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first or time.monotonic() - began
                    text.append(piece)
            timings = event.get("timings") or timings
    return "".join(text), first, time.monotonic() - began, timings


async def converse(url: str, models: list[str], turns: int, opening_words: int, name: str) -> Side:
    """Round robin: each agent's turn in order, `turns` times; every turn after the first swaps models."""
    side = Side(name)
    talks = [[{"role": "user", "content": words(opening_words, seed)}] for seed in range(len(models))]
    previous = None
    seen = [0] * len(models)
    began = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as http:
        for turn in range(turns):
            for agent, model in enumerate(models):
                answer, first, seconds, timings = await ask(http, url, model, talks[agent])
                processed, cached = int(timings.get("prompt_n", 0)), int(timings.get("cache_n", 0))
                side.turns.append(Turn(seconds, first, processed, cached, previous not in (None, model),
                                       seen[agent]))
                seen[agent] = processed + cached + int(timings.get("predicted_n", 0))
                previous = model
                talks[agent] += [{"role": "assistant", "content": answer},
                                 {"role": "user", "content": words(opening_words // 3, 100 * turn + agent)}]
            print(f"  {name}: turn {turn + 1}/{turns} done", file=sys.stderr)
    side.total = time.monotonic() - began
    return side


def server_argv(binary: str) -> list[str]:
    return [binary, "--host", HOST, "-c", str(CONTEXT), "-np", "1", "-t", "1", "-tb", "1", "--no-warmup"]


def llmswap_config(folder: Path, binary: str, ggufs: dict[str, Path], *, kv: bool) -> Path:
    models = {
        name: {"cmd": " ".join([*server_argv(binary), "--port", "${PORT}", "-m", str(path),
                                "--slot-save-path", "${KV_DIR}"]),
               "proxy": f"http://{HOST}:${{PORT}}", "kvCache": kv}
        for name, path in ggufs.items()
    }
    config = folder / ("kv-on.yaml" if kv else "kv-off.yaml")
    config.write_text(json.dumps({"healthCheckTimeout": 120, "startPort": free_port(),
                                  "kvCache": {"dir": str(folder / "kv")}, "models": models}, indent=2))
    return config


async def llmswap_side(folder: Path, binary: str, ggufs: dict[str, Path], turns: int, opening: int,
                       *, kv: bool) -> Side:
    config = llmswap_config(folder, binary, ggufs, kv=kv)
    async with running_llmswap(config, []) as server:
        return await converse(server.url, list(ggufs), turns, opening,
                              "llmswap, kvCache on" if kv else "llmswap, kvCache off")


async def router_side(folder: Path, binary: str, ggufs: dict[str, Path], turns: int, opening: int) -> Side:
    """llama.cpp's router: one llama-server that starts a child per model, at most one loaded."""
    models = folder / "router-models"
    models.mkdir()
    for name, path in ggufs.items():
        (models / f"{name}.gguf").symlink_to(path)
    port = free_port()
    argv = [*server_argv(binary), "--port", str(port), "--models-dir", str(models), "--models-max", "1"]
    url = f"http://{HOST}:{port}"
    async with running_process(argv, [f"{url}/health"], folder / "router.log"):
        return await converse(url, list(ggufs), turns, opening, "llama.cpp router (--models-max 1)")


async def llama_swap_side(folder: Path, binary: str, ggufs: dict[str, Path], turns: int, opening: int,
                          llama_swap: str) -> Side:
    config = llmswap_config(folder, binary, ggufs, kv=False)
    document = json.loads(config.read_text())
    document.pop("kvCache")
    for entry in document["models"].values():
        entry.pop("kvCache")
        entry["cmd"] = entry["cmd"].replace(" --slot-save-path ${KV_DIR}", "")
    swap_config = folder / "llama-swap.yaml"
    swap_config.write_text(json.dumps(document))
    port = free_port()
    url = f"http://{HOST}:{port}"
    async with running_process([llama_swap, "--config", str(swap_config), "--listen", f"{HOST}:{port}"],
                               [f"{url}/health"], folder / "llama-swap.log"):
        return await converse(url, list(ggufs), turns, opening, "llama-swap")


def side_rows(side: Side, baseline: Side, against: str) -> list[Row]:
    """A side's total time, first token after a swap (p50, max) and prompt tokens processed again, each
    against the baseline's (bench.swap_real's rows too)."""
    label = side.name
    base_p50, side_p50 = statistics.median(baseline.after_swap), statistics.median(side.after_swap)
    return [
        Row(f"{label}: total time", against, f"{baseline.total:.1f} s", f"{side.total:.1f} s",
            ratio(side.total, baseline.total)),
        Row(f"{label}: first token after a swap, p50", against, ms(base_p50), ms(side_p50),
            ratio(side_p50, base_p50)),
        Row(f"{label}: first token after a swap, max", against, ms(max(baseline.after_swap)),
            ms(max(side.after_swap)), ratio(max(side.after_swap), max(baseline.after_swap))),
        Row(f"{label}: prompt tokens processed again (of {side.prompt_tokens})", against,
            f"{baseline.again:,}", f"{side.again:,}", ratio(side.again, baseline.again)),
    ]


def rows(baseline: Side, sides: list[Side]) -> list[Row]:
    against = f"{baseline.name}, same run"
    return [row for side in sides for row in side_rows(side, baseline, against)]


async def main(agents: int, turns: int, opening: int) -> None:
    from tests.helpers.gguf_model import TinyLlama, tiny_llama
    from tests.helpers.llama_server import llama_server_binary

    binary = llama_server_binary()
    if binary is None:
        raise SystemExit("llama-server not found: run .ci/install-llama-server.sh (or set LLAMA_SERVER)")
    with tempfile.TemporaryDirectory(prefix="llmswap-swap-penalty-") as temporary:
        folder = Path(temporary)
        names = ("alpha", "beta", "gamma")[:agents]
        # The "medium" shape (about 24M parameters): its prompt processing, not its load, is what a swap
        # costs a conversation, as with real models.
        ggufs = {name: tiny_llama(TinyLlama(name, embedding=512, layers=8, feed_forward=1408, heads=8,
                                            kv_heads=4, context=CONTEXT, seed=20 + index), folder / "gguf")
                 for index, name in enumerate(names)}
        runs: list[tuple[str, Callable[[], Awaitable[Side]]]] = [
            ("kv off", lambda: llmswap_side(folder, binary, ggufs, turns, opening, kv=False)),
            ("kv on", lambda: llmswap_side(folder, binary, ggufs, turns, opening, kv=True)),
            ("router", lambda: router_side(folder, binary, ggufs, turns, opening)),
        ]
        llama_swap = find_llama_swap()
        if llama_swap is not None:
            found = llama_swap
            runs.append(("llama-swap", lambda: llama_swap_side(folder, binary, ggufs, turns, opening, found)))
        sides = []
        for label, run in runs:
            print(f"{label}...", file=sys.stderr)
            sides.append(await run())
    baseline = sides[0]
    table = rows(baseline, sides[1:])
    if llama_swap is None:
        table.append(Row.skipped("llama-swap", "no llama-swap binary beside the repository or on PATH"))
    print(f"swap penalty: {agents} agents, {turns} turns each, openings of {opening} words; one model loaded "
          f"at a time\n\nmachine: {describe_machine()}\n")
    print(markdown_table(table))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=2, choices=(2, 3))
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--words", type=int, default=1200, help="words in each agent's opening message")
    options = parser.parse_args()
    asyncio.run(main(options.agents, options.turns, options.words))
