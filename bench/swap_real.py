"""Swaps at real size: two agents, each bound to its own ~1 GB model (a 1B-class llama shape in f16, random
weights, generated here: tests/helpers/gguf_model.py), talking at the same time in growing conversations,
one model loaded at a time. While one agent's turn runs, the other's waits: every turn swaps, and the swap
waits for the turn in flight to end (its drain) before the model that is asked for can start.

    python -m bench.swap_real [--turns 7] [--words 600]

Systems, in the same run, on the same conversations (greedy decoding: the same answers everywhere):
- llmswap, `prefetch: true` and `kvCache.save: auto` (its defaults);
- llmswap, `prefetch: false` and `kvCache.save: always` (the kvCache of the previous round);
- llmswap with `kvCache` off (the floor llmswap must never be slower than);
- llama-swap (`../shared/bin/llama-swap` beside the repository, else a `llama-swap` on PATH);
- llama.cpp's own router mode (`llama-server --models-dir DIR --models-max 1`).

Before each system's run the models' pages are dropped from the page cache (`posix_fadvise(DONTNEED)` on
both files, which needs no root; as root, `/proc/sys/vm/drop_caches` as well): every system starts cold.
Rows: total time, first token after a swap (p50, max), each swap phase's mean (llmswap's
`llmswap_swap_phase_seconds`), prompt tokens processed again, and how many answers equal those of llmswap
without kvCache (every prompt computed whole, as the peers do), each against the best peer (llama-swap or
the router, whichever finished first). Needs llama-server (.ci/install-llama-server.sh) and about 2.2 GB of
disk for the models.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.launch import HOST, find_llama_swap, free_port, running_llmswap, running_process
from bench.report import Row, markdown_table, ms
from bench.report import machine as describe_machine
from bench.swap_penalty import Side, Turn, ask, server_argv, side_rows, words

CONTEXT = 4096
PHASES = ("drain", "save", "stop", "prefetch", "start", "restore", "wake")


@dataclass
class System(Side):
    """One system's run: its turns (`Side`), and its answers and llmswap's phases beside them."""

    answers: dict[int, list[str]] = field(default_factory=dict)  # per agent, in order
    phases: dict[str, float] = field(default_factory=dict)  # mean seconds per phase (llmswap only)


def drop_page_cache(files: list[Path]) -> str:
    """Drop `files` from the page cache (and, as root, everything clean); says how."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return "the models' pages dropped, and the whole page cache (root)"
    except OSError:
        return "the models' pages dropped (posix_fadvise); the rest of the page cache kept (not root)"


async def agents_talk(url: str, models: list[str], turns: int, opening: int, system: System) -> None:
    """Every agent runs its own conversation at the same time; a turn swaps when the turn served just before
    it (by any agent) was another model's."""
    last_model: list[str | None] = [None]

    async def agent(index: int, model: str, http: aiohttp.ClientSession) -> None:
        talk = [{"role": "user", "content": words(opening, index)}]
        seen = 0
        system.answers[index] = []
        for turn in range(turns):
            answer, first, seconds, timings = await ask(http, url, model, talk)
            processed, cached = int(timings.get("prompt_n", 0)), int(timings.get("cache_n", 0))
            system.turns.append(Turn(seconds, first, processed, cached, last_model[0] != model, seen))
            last_model[0] = model
            seen = processed + cached + int(timings.get("predicted_n", 0))
            system.answers[index].append(answer)
            talk += [{"role": "assistant", "content": answer},
                     {"role": "user", "content": words(opening // 3, 100 * turn + index)}]

    began = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as http:
        await asyncio.gather(*(agent(index, model, http) for index, model in enumerate(models)))
    system.total = time.monotonic() - began


def llmswap_config(folder: Path, binary: str, ggufs: dict[str, Path], name: str, *, prefetch: bool,
                   save: str | None) -> Path:
    models = {
        model: {"cmd": " ".join([*server_argv(binary), "--port", "${PORT}", "-m", str(path),
                                 "--slot-save-path", "${KV_DIR}"]),
                "proxy": f"http://{HOST}:${{PORT}}", "kvCache": save is not None}
        for model, path in ggufs.items()
    }
    config = folder / f"{name}.yaml"
    kv = {"dir": str(folder / f"kv-{name}"), "save": save or "auto"}
    config.write_text(json.dumps({"healthCheckTimeout": 300, "startPort": free_port(), "prefetch": prefetch,
                                  "kvCache": kv, "models": models}, indent=2))
    return config


def phase_means(metrics: str) -> dict[str, float]:
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in metrics.splitlines():
        found = re.match(r'llmswap_swap_phase_seconds_(sum|count)\{model="[^"]*",phase="(\w+)"\} (\S+)', line)
        if found:
            kind, phase, value = found.groups()
            into = sums if kind == "sum" else counts
            into[phase] = into.get(phase, 0.0) + float(value)
    return {phase: sums[phase] / counts[phase] for phase in sums if counts.get(phase)}


async def llmswap_system(folder: Path, binary: str, ggufs: dict[str, Path], turns: int, opening: int,
                         name: str, *, prefetch: bool, save: str | None) -> System:
    system = System(name)
    config = llmswap_config(folder, binary, ggufs, re.sub(r"\W+", "-", name), prefetch=prefetch, save=save)
    async with running_llmswap(config, []) as server:
        await agents_talk(server.url, list(ggufs), turns, opening, system)
        async with aiohttp.ClientSession() as http, http.get(f"{server.url}/metrics") as response:
            system.phases = phase_means(await response.text())
    return system


async def router_system(folder: Path, binary: str, ggufs: dict[str, Path], turns: int,
                        opening: int) -> System:
    models = folder / "router-models"
    models.mkdir(exist_ok=True)
    for model, path in ggufs.items():
        link = models / f"{model}.gguf"
        if not link.exists():
            link.symlink_to(path)
    port = free_port()
    url = f"http://{HOST}:{port}"
    system = System("llama.cpp router (--models-max 1)")
    argv = [*server_argv(binary), "--port", str(port), "--models-dir", str(models), "--models-max", "1"]
    async with running_process(argv, [f"{url}/health"], folder / "router.log"):
        await agents_talk(url, list(ggufs), turns, opening, system)
    return system


async def llama_swap_system(folder: Path, binary: str, ggufs: dict[str, Path], turns: int, opening: int,
                            llama_swap: str) -> System:
    models = {model: {"cmd": " ".join([*server_argv(binary), "--port", "${PORT}", "-m", str(path)]),
                      "proxy": f"http://{HOST}:${{PORT}}"} for model, path in ggufs.items()}
    config = folder / "llama-swap.yaml"
    config.write_text(json.dumps({"healthCheckTimeout": 300, "startPort": free_port(), "models": models}))
    port = free_port()
    url = f"http://{HOST}:{port}"
    system = System("llama-swap")
    async with running_process([llama_swap, "--config", str(config), "--listen", f"{HOST}:{port}"],
                               [f"{url}/health"], folder / "llama-swap.log"):
        await agents_talk(url, list(ggufs), turns, opening, system)
    return system


def agreeing(system: System, reference: System) -> str:
    """How many of `system`'s answers are the same text as `reference`'s, turn by turn."""
    pairs = [(mine, theirs) for agent, answers in system.answers.items()
             for mine, theirs in zip(answers, reference.answers.get(agent, []), strict=False)]
    return f"{sum(mine == theirs for mine, theirs in pairs)} of {len(pairs)}"


def rows(best: System, systems: list[System], reference: System) -> list[Row]:
    against = f"{best.name} (best peer), same run"
    found: list[Row] = []
    for system in systems:
        label = system.name
        found += side_rows(system, best, against)
        found.append(Row(f"{label}: answers equal to {reference.name}'s", against, agreeing(best, reference),
                         agreeing(system, reference), ""))
        for phase in PHASES:
            if phase in system.phases:
                found.append(Row(f"{label}: mean {phase} phase", "llmswap's own measure", "",
                                 ms(system.phases[phase]), ""))
    return found


async def main(turns: int, opening: int) -> None:
    from tests.helpers.gguf_model import TinyLlama, tiny_llama
    from tests.helpers.llama_server import llama_server_binary

    binary = llama_server_binary()
    if binary is None:
        raise SystemExit("llama-server not found: run .ci/install-llama-server.sh (or set LLAMA_SERVER)")
    with tempfile.TemporaryDirectory(prefix="llmswap-swap-real-") as temporary:
        folder = Path(temporary)
        print("writing two ~1 GB models...", file=sys.stderr)
        ggufs = {name: tiny_llama(TinyLlama(name, embedding=2048, layers=12, feed_forward=5632, heads=16,
                                            kv_heads=2, context=CONTEXT, seed=40 + index), folder / "gguf")
                 for index, name in enumerate(("alpha", "beta"))}
        runs: list[tuple[str, Callable[[], Awaitable[System]]]] = [
            ("llmswap", lambda: llmswap_system(folder, binary, ggufs, turns, opening,
                                               "llmswap (prefetch, save auto)", prefetch=True, save="auto")),
            ("llmswap, previous", lambda: llmswap_system(
                folder, binary, ggufs, turns, opening, "llmswap (no prefetch, save always)", prefetch=False,
                save="always")),
            ("llmswap, kv off", lambda: llmswap_system(folder, binary, ggufs, turns, opening,
                                                       "llmswap (kvCache off)", prefetch=True, save=None)),
            ("router", lambda: router_system(folder, binary, ggufs, turns, opening)),
        ]
        llama_swap = find_llama_swap()
        if llama_swap is not None:
            found = llama_swap
            runs.append(("llama-swap",
                         lambda: llama_swap_system(folder, binary, ggufs, turns, opening, found)))
        systems: list[System] = []
        dropped = ""
        for label, run in runs:
            dropped = drop_page_cache(list(ggufs.values()))
            print(f"{label}...", file=sys.stderr)
            systems.append(await run())
    peers = [s for s in systems if not s.name.startswith("llmswap")]
    best = min(peers, key=lambda s: s.total)
    # Answers are compared with llmswap's without kvCache: the same llama-server computing every prompt whole,
    # as the peers do. A restored cache computes only the new tokens, in other batches: with random weights
    # the top two tokens can be that close, so an answer may differ without anything being wrong.
    reference = next(s for s in systems if s.name == "llmswap (kvCache off)")
    table = rows(best, systems, reference)
    if llama_swap is None:
        table.append(Row.skipped("llama-swap", "no llama-swap binary beside the repository or on PATH"))
    print(f"swap at real size: 2 agents at once, {turns} turns each, openings of {opening} words, two "
          f"~1 GB models (1B-class, f16), one loaded at a time; before each system: {dropped}\n\n"
          f"machine: {describe_machine()}\n")
    print(markdown_table(table))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # An agent's conversation: 7 turns from a 600-word opening, about 20,900 prompt tokens in all (29 min
    # for the five systems on 2 cores); --turns 3 --words 300 is a 4-minute smoke run.
    parser.add_argument("--turns", type=int, default=7)
    parser.add_argument("--words", type=int, default=600, help="words in each agent's opening message")
    options = parser.parse_args()
    asyncio.run(main(options.turns, options.words))
