"""This checkout beside another build of llmswap (a git revision), in one run: the latency each adds to a warm
request and its CPU per request, set side by side round by round.

Run: `python -m bench.beside_build REV [--requests 3000] [--rounds 8]`. Not part of `python -m bench`: it
answers "did this change make the warm path cheaper?", which a table of ratios against other programs
cannot, on a machine whose speed moves within a run (the 2-vCPU VMs here: one build's CPU per request moved
from 410 to 985 us over twelve rounds). Prints a markdown table; asserts nothing.

REV is checked out into a temporary git worktree and run with this checkout's Python and dependencies
(`PYTHONPATH` set to the worktree), so a revision that needs other dependencies than this one's is not
comparable this way. Each build starts an identical minimal upstream (`bench.proxy_overhead`'s) and
preloads it. Then, against the upstream read directly in the same blocks:
- added latency p50 and p99: sequential whole chat completions in blocks of 100 that alternate the sides,
  each side's percentile minus the direct request's;
- CPU per request: rounds of `--requests` whole chat completions, 64 in flight, alternating which build
  goes first; each pair of consecutive rounds gives one ratio (the machine changes less between two
  rounds than over the run), and the row is the median of those ratios, with their spread.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import aiohttp

from bench import proxy_overhead
from bench.beside_llama_swap import IN_FLIGHT, MODEL, Side, cpu_round, latency, model_entry
from bench.launch import HOST, REPO, free_port, running_process, write_config
from bench.report import Row, markdown_table, ms, ratio
from bench.report import machine as describe_machine


def paired_ratios(ours: Sequence[float], theirs: Sequence[float]) -> list[float]:
    """Round i of this checkout over round i of the other build, for every round both have."""
    return [a / b for a, b in zip(ours, theirs, strict=False) if b > 0]


@contextlib.contextmanager
def worktree(rev: str, under: Path) -> Iterator[Path]:
    """`rev` checked out (detached) in a temporary worktree of this repository; removed afterwards."""
    path = under / "other"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(path), rev],
                   check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], check=False)


@contextlib.asynccontextmanager
async def build_serving(tree: Path, folder: Path, label: str) -> AsyncIterator[tuple[Side, Side]]:
    """The llmswap of `tree` in front of its own minimal upstream: (its side, the upstream's side)."""
    upstream, port = free_port(), free_port()
    config = write_config(folder / f"{label}.yaml", {MODEL: model_entry(upstream)}, preload=[MODEL])
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [sys.executable, "-m", "llmswap", "--config", str(config), "--listen", f"{HOST}:{port}"]
    url, direct = f"http://{HOST}:{port}", f"http://{HOST}:{upstream}"
    async with running_process(argv, [f"{url}/health", f"{direct}/health"], folder / f"{label}.log", cwd=tree,
                               env=env) as process:
        yield Side(label, url, process.pid), Side(f"{label} direct", direct)


async def measure(rev: str, requests: int, rounds: int) -> list[Row]:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        with worktree(rev, folder) as other:
            async with build_serving(REPO, folder, "this checkout") as (ours, direct), \
                    build_serving(other, folder, rev) as (theirs, _):
                connector = aiohttp.TCPConnector(limit=0)
                async with aiohttp.ClientSession(connector=connector) as http:
                    await latency(http, [Side(s.name, s.url) for s in (direct, ours, theirs)], 300)
                    await latency(http, [direct, ours, theirs], requests)
                    for index in range(rounds):
                        for side in (ours, theirs) if index % 2 == 0 else (theirs, ours):
                            await cpu_round(http, side, requests)
                return rows(rev, direct, ours, theirs, requests)


def rows(rev: str, direct: Side, ours: Side, theirs: Side, requests: int) -> list[Row]:
    against = f"llmswap at {rev}, same run"
    table: list[Row] = []
    for q in (50, 99):
        base = proxy_overhead.percentile(direct.latencies, q)
        mine = proxy_overhead.percentile(ours.latencies, q) - base
        other = proxy_overhead.percentile(theirs.latencies, q) - base
        table.append(Row(f"added latency p{q}: whole chat completion, {requests} sequential, minus direct",
                         against, ms(other), ms(mine), ratio(mine, other)))
    pairs = paired_ratios(ours.cpu_per_request, theirs.cpu_per_request)
    spread = f"{min(pairs):.2f}..{max(pairs):.2f}" if pairs else "none"
    measure = f"CPU per warm request, {IN_FLIGHT} in flight, median of {len(pairs)} paired rounds"
    other_cpu = statistics.median(theirs.cpu_per_request) * 1e6
    our_cpu = statistics.median(ours.cpu_per_request) * 1e6
    table.append(Row(f"{measure} (by round {spread})", against, f"{other_cpu:.0f} us", f"{our_cpu:.0f} us",
                     f"x{statistics.median(pairs):.2f}" if pairs else "n/a"))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.beside_build",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("rev", help="the git revision to set beside this checkout (a commit, a tag, HEAD~3)")
    parser.add_argument("--requests", type=int, default=3000,
                        help="sequential requests per side, and requests per CPU round")
    parser.add_argument("--rounds", type=int, default=8, help="CPU rounds per build")
    args = parser.parse_args(argv)
    table = asyncio.run(measure(args.rev, args.requests, args.rounds))
    print(markdown_table(table))
    print(f"\n{describe_machine()}\n\n`python -m bench.beside_build {args.rev}`")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
