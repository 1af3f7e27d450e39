"""Throughput under concurrency: wrk posting a chat request to nginx, directly and through llmswap.

Run: `python -m bench.wrk_nginx [--seconds 5] [--connections 1,16,64,256] [--rounds 3]`. Prints
a markdown table; asserts nothing.

nginx answers every POST with a fixed chat completion, so the upstream costs next to nothing and what is
measured is the proxy's cost per request. llmswap starts that nginx itself (it is the model's `cmd`, with
`/health` as its check endpoint), so the path is the real one: a model started, health-checked and served
by the scheduler. At each connection count the two sides run back to back, in rounds that alternate which
goes first, so that drift of a shared machine touches both alike: a side's figure is its median over the
rounds, the ratio the median of the rounds' own ratios. The rounds take every connection count in turn,
so the last row (llmswap at 256 connections against its own 64) compares runs minutes apart at most.

At 64 connections each round also runs wrk through a bare aiohttp proxy (`bench.bare_proxy`: aiohttp's server
and client and nothing else) to the same nginx, and reads the CPU time llmswap and that proxy spent per
request: what the library costs any proxy built on it, told apart from what llmswap's own work costs.

nginx and wrk are Debian packages: when either is missing the benchmark installs it with apt-get (as root,
or through sudo without a password) and, if that is not possible, prints one line saying so and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.launch import HOST, REPO, free_port, running_llmswap, wait_answering, write_config
from bench.report import Row, markdown_table, ms, per_second, ratio
from bench.report import machine as describe_machine

MODEL = "bench"
CONNECTIONS = (1, 16, 64, 256)
ANSWER = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "one two three four"},
                 "finish_reason": "length"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5},
})
REQUEST = json.dumps({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
PACKAGES = {"nginx": "nginx-light", "wrk": "wrk"}
SBIN = ("/usr/sbin", "/sbin")


def find(tool: str) -> str | None:
    return shutil.which(tool) or shutil.which(tool, path=os.pathsep.join(SBIN))


def ensure_tools() -> str | None:
    """Install nginx and wrk from Debian's packages when missing; the reason they cannot be had, or None."""
    missing = [tool for tool in PACKAGES if find(tool) is None]
    if not missing:
        return None
    if shutil.which("apt-get") is None:
        return f"{' and '.join(missing)} not installed, and no apt-get to install them"
    sudo: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            return f"{' and '.join(missing)} not installed; installing them needs root"
        sudo = ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    packages = [PACKAGES[tool] for tool in missing]
    for command in ([*sudo, "apt-get", "update", "-qq"],
                    [*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return f"`{' '.join(command)}` failed: {done.stderr.strip().splitlines()[-1:]}"
    still = [tool for tool in PACKAGES if find(tool) is None]
    return f"{' and '.join(still)} still missing after apt-get install" if still else None


def nginx_config(folder: Path, port: int) -> Path:
    """One nginx worker: POSTs get the fixed completion, /health 200; no logs; its files in `folder`."""
    answer = ANSWER.replace("'", "\\'")
    conf = folder / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
daemon off;
pid {folder}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {folder}/body;
    proxy_temp_path {folder}/proxy;
    fastcgi_temp_path {folder}/fastcgi;
    uwsgi_temp_path {folder}/uwsgi;
    scgi_temp_path {folder}/scgi;
    keepalive_requests 1000000;
    server {{
        listen {HOST}:{port};
        location = /health {{ return 200 'ok'; }}
        location / {{
            default_type application/json;
            return 200 '{answer}';
        }}
    }}
}}
""")
    return conf


BARE_AT = 64  # the connection count at which llmswap is also set against a bare aiohttp proxy


@dataclass(frozen=True)
class WrkResult:
    requests_per_second: float
    p50: float  # seconds
    p99: float
    errors: int
    requests: int = 0  # answered in the run


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def _duration(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if match is None:
        raise ValueError(f"wrk printed a latency {text!r} this benchmark cannot read")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_wrk(output: str) -> WrkResult:
    """Requests/sec, the 50% and 99% latency lines of `--latency`, and every kind of error wrk counted."""
    rate = re.search(r"Requests/sec:\s+([\d.]+)", output)
    p50 = re.search(r"^\s+50%\s+(\S+)", output, re.MULTILINE)
    p99 = re.search(r"^\s+99%\s+(\S+)", output, re.MULTILINE)
    if rate is None or p50 is None or p99 is None:
        raise SystemExit("wrk's output has no Requests/sec or latency distribution:\n" + output)
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", output))
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    errors += int(non_2xx.group(1)) if non_2xx else 0
    count = re.search(r"(\d+) requests in", output)
    return WrkResult(float(rate.group(1)), _duration(p50.group(1)), _duration(p99.group(1)), errors,
                     int(count.group(1)) if count else 0)


@dataclass(frozen=True)
class Costed:
    """One wrk run through a proxy, and the CPU time (user + system) that proxy's process spent in it."""

    wrk: WrkResult
    cpu: float  # seconds

    @property
    def cpu_per_request(self) -> float:
        return self.cpu / self.wrk.requests if self.wrk.requests else 0.0


async def costed(pid: int, url: str, connections: int, seconds: float, script: Path) -> Costed:
    process = psutil.Process(pid)
    before = process.cpu_times()
    result = await wrk(url, connections, seconds, script)
    after = process.cpu_times()
    return Costed(result, (after.user - before.user) + (after.system - before.system))


@contextlib.asynccontextmanager
async def bare_proxy(upstream: str, folder: Path) -> AsyncIterator[tuple[int, str]]:
    """`bench.bare_proxy` in front of `upstream`: its pid and its URL, once it answers."""
    port = free_port()
    with (folder / "bare_proxy.log").open("wb") as log:
        process = subprocess.Popen(  # noqa: ASYNC220 (started once, before anything is measured)
            [sys.executable, "-m", "bench.bare_proxy", str(port), upstream], stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        url = f"http://{HOST}:{port}"
        await wait_answering(process, [f"{url}/health"], "bench.bare_proxy")
        yield process.pid, url
    finally:
        process.terminate()
        process.wait()


async def wrk(url: str, connections: int, seconds: float, script: Path) -> WrkResult:
    process = await asyncio.create_subprocess_exec(
        find("wrk") or "wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", str(script),
        url, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    return parse_wrk(output.decode(errors="replace"))


def post_script(folder: Path) -> Path:
    script = folder / "post.lua"
    body = REQUEST.replace("\\", "\\\\").replace('"', '\\"')
    script.write_text(f'wrk.method = "POST"\nwrk.body = "{body}"\n'
                      'wrk.headers["Content-Type"] = "application/json"\n')
    return script


async def measure(seconds: float, connections: tuple[int, ...], rounds: int = 1) -> list[Row]:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        port = free_port()
        conf = nginx_config(folder, port)
        config = write_config(folder / "config.yaml", {MODEL: {
            "cmd": f"{find('nginx')} -c {conf}", "proxy": f"http://{HOST}:{port}", "checkEndpoint": "/health",
            "concurrencyLimit": 4096,
        }}, preload=[MODEL])
        script = post_script(folder)
        direct_url = f"http://{HOST}:{port}/v1/chat/completions"
        async with running_llmswap(config, [f"http://{HOST}:{port}/health"]) as server, \
                bare_proxy(f"http://{HOST}:{port}", folder) as (bare_pid, bare_root):
            proxied_url = f"{server.url}/v1/chat/completions"
            bare_url = f"{bare_root}/v1/chat/completions"
            for url in (proxied_url, direct_url, bare_url):
                await wrk(url, 16, 1, script)  # warm every side: pools, caches
            runs: dict[int, list[Pair]] = {count: [] for count in connections}
            against_bare: list[tuple[Costed, Costed]] = []
            for round_ in range(rounds):
                for count in connections:
                    print(f"bench.wrk_nginx: {count} connections, round {round_ + 1} of {rounds}...",
                          file=sys.stderr, flush=True)
                    # Who goes first alternates from round to round, so drift touches both sides alike.
                    if round_ % 2 == 0:
                        direct = await wrk(direct_url, count, seconds, script)
                        proxied = await wrk(proxied_url, count, seconds, script)
                    else:
                        proxied = await wrk(proxied_url, count, seconds, script)
                        direct = await wrk(direct_url, count, seconds, script)
                    runs[count].append(Pair(direct, proxied))
                    if count == BARE_AT:  # the same alternation: llmswap first in even rounds
                        if round_ % 2 == 0:
                            ours = await costed(server.pid, proxied_url, count, seconds, script)
                            bare = await costed(bare_pid, bare_url, count, seconds, script)
                        else:
                            bare = await costed(bare_pid, bare_url, count, seconds, script)
                            ours = await costed(server.pid, proxied_url, count, seconds, script)
                        against_bare.append((ours, bare))
    rows: list[Row] = []
    for count in connections:
        rows += rows_for(count, runs[count])
    if 64 in runs and 256 in runs:
        rows.append(more_connections_row(runs[64], runs[256]))
    if against_bare:
        rows += bare_rows(against_bare)
    return rows


def bare_rows(rounds: list[tuple[Costed, Costed]]) -> list[Row]:
    """llmswap against the bare aiohttp proxy at `BARE_AT` connections: throughput (the median of the rounds'
    own ratios) and CPU time per request (each side's median)."""
    median = statistics.median
    name = f"wrk, {BARE_AT} connections, against a bare aiohttp proxy"
    baseline = "bare aiohttp proxy (server + client only)"
    ours = median([o.wrk.requests_per_second for o, _ in rounds])
    bare = median([b.wrk.requests_per_second for _, b in rounds])
    each = [o.wrk.requests_per_second / b.wrk.requests_per_second for o, b in rounds]
    cpu_ours = median([o.cpu_per_request for o, _ in rounds])
    cpu_bare = median([b.cpu_per_request for _, b in rounds])
    return [
        Row(f"{name}: throughput{_of(len(rounds))}", baseline, per_second(bare, "req"),
            per_second(ours, "req"), ratio(median(each), 1.0)),
        Row(f"{name}: CPU per request{_of(len(rounds))}", baseline, f"{cpu_bare * 1e6:.0f} µs",
            f"{cpu_ours * 1e6:.0f} µs", ratio(cpu_ours, cpu_bare)),
    ]


@dataclass(frozen=True)
class Pair:
    """One round at one connection count: nginx direct, then through llmswap (or the other way round)."""

    direct: WrkResult
    proxied: WrkResult

    @property
    def ratio(self) -> float:
        return self.proxied.requests_per_second / self.direct.requests_per_second


def _named(connections: int) -> str:
    return f"wrk, {connections} connection{'s' if connections > 1 else ''}"


def _of(rounds: int) -> str:
    return f", median of {rounds}" if rounds > 1 else ""


def rows_for(connections: int, runs: list[Pair]) -> list[Row]:
    """Throughput and latency at one connection count: the median of each side over the rounds, and the
    median of the rounds' own ratios (each from two runs back to back)."""
    errors = ""
    direct_errors = sum(run.direct.errors for run in runs)
    proxied_errors = sum(run.proxied.errors for run in runs)
    if direct_errors or proxied_errors:
        errors = f"; errors: direct {direct_errors}, llmswap {proxied_errors}"
    name = _named(connections)
    of = _of(len(runs))
    median = statistics.median
    direct_rate = median([run.direct.requests_per_second for run in runs])
    proxied_rate = median([run.proxied.requests_per_second for run in runs])
    direct_p50, proxied_p50 = median([r.direct.p50 for r in runs]), median([r.proxied.p50 for r in runs])
    direct_p99, proxied_p99 = median([r.direct.p99 for r in runs]), median([r.proxied.p99 for r in runs])
    return [
        Row(f"{name}: throughput{of}{errors}", "direct to nginx", per_second(direct_rate, "req"),
            per_second(proxied_rate, "req"), ratio(median([run.ratio for run in runs]), 1.0)),
        Row(f"{name}: latency p50 / p99{of}", "direct to nginx", f"{ms(direct_p50)} / {ms(direct_p99)}",
            f"{ms(proxied_p50)} / {ms(proxied_p99)}",
            f"{(proxied_p50 - direct_p50) * 1000:+.2f} ms / {(proxied_p99 - direct_p99) * 1000:+.2f} ms"),
    ]


def more_connections_row(at_64: list[Pair], at_256: list[Pair]) -> Row:
    """llmswap's throughput at 256 connections against its own at 64: the rounds' ratios, each from runs of
    the same round (minutes apart at most), and the median of those."""
    rates_64 = [run.proxied.requests_per_second for run in at_64]
    rates_256 = [run.proxied.requests_per_second for run in at_256]
    each = [high / low for low, high in zip(rates_64, rates_256, strict=True)]
    name = "wrk, llmswap at 256 connections against 64"
    low, high = statistics.median(rates_64), statistics.median(rates_256)
    return Row(f"{name}{_of(len(each))}", "llmswap at 64 connections", per_second(low, "req"),
               per_second(high, "req"), ratio(statistics.median(each), 1.0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wrk_nginx",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each wrk run (default 5)")
    parser.add_argument("--connections", default=",".join(map(str, CONNECTIONS)),
                        help="comma-separated connection counts (default 1,16,64,256)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of each side at each count, alternating who goes first (default 3)")
    args = parser.parse_args(argv)
    counts = tuple(int(part) for part in args.connections.split(",") if part.strip())
    if (reason := ensure_tools()) is not None:
        print(f"bench.wrk_nginx: skipped: {reason}")
        return 0
    rows = asyncio.run(measure(args.seconds, counts, args.rounds))
    print(f"Machine: {describe_machine()}")
    command = (f"python -m bench.wrk_nginx --seconds {args.seconds:g} --connections {args.connections} "
               f"--rounds {args.rounds}")
    print(f"Command: `{command}`\n")
    print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
