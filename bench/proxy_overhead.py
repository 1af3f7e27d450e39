"""Proxy overhead: latency and throughput through llmswap against the same upstream hit directly.

Run: `python -m bench.proxy_overhead [--requests 2000] [--concurrency 32] [--loop both|asyncio|uvloop]
[--upstream raw|demo]`. Prints a table; asserts nothing.

One run measures both sides against one upstream process: llmswap is started as a real server (its CLI
code path) on a config whose only model is that upstream, preloaded; the benchmark then sends the same
requests to the upstream's own port ("direct") and through llmswap ("via llmswap"), interleaved in
blocks so that drift of a shared machine hits both alike. Reported: per-request latency at concurrency 1
(p50, p99; whole responses and streamed ones), and throughput at `--concurrency` requests in flight.
The ratios are the result; absolute numbers depend on the machine.

The upstream must not be the bottleneck: by default it is a minimal aiohttp low-level server answering a
fixed chat completion (`raw`); `--upstream demo` uses llmswap's demo upstream with no token pacing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

HOST = "127.0.0.1"
MODEL = "bench"
BLOCK = 100  # requests per interleaved block in the latency phases
ROUNDS = 3  # interleaved rounds per side in the throughput phase
READY_WITHIN = 60.0

CHAT = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
STREAM_CHAT = {**CHAT, "stream": True}


# ------------------------------------------------------------------------------------------- upstream


def _completion() -> bytes:
    return json.dumps({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "one two three four"},
                     "finish_reason": "length"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5},
    }).encode()


def _chunks() -> list[bytes]:
    def chunk(delta: dict[str, str], finish: str | None) -> bytes:
        body = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    words = ["one", " two", " three", " four"]
    usage = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
             "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}}
    return [chunk({"role": "assistant", "content": ""}, None), *(chunk({"content": w}, None) for w in words),
            chunk({}, "length"), b"data: " + json.dumps(usage).encode() + b"\n\n", b"data: [DONE]\n\n"]


async def _serve_raw_upstream(port: int) -> None:
    """A fixed-answer OpenAI-ish upstream: as little work per request as aiohttp allows."""
    completion, chunks = _completion(), _chunks()

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        if request.path == "/health":
            return web.Response(text="OK")
        body = await request.read()
        if b'"stream": true' not in body and b'"stream":true' not in body:
            return web.Response(body=completion, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        # A long stream when asked (`max_tokens` beyond the four words): that many content chunks, as fast
        # as the socket takes them (bench.beside_llama_swap's concurrent streams).
        words = json.loads(body).get("max_tokens", 4)
        for part in chunks if words <= 4 else [*chunks[:1], *([chunks[1]] * words), *chunks[-3:]]:
            await response.write(part)
        await response.write_eof()
        return response

    server = web.Server(handle, access_log=None)
    loop = asyncio.get_running_loop()
    await loop.create_server(server, HOST, port, backlog=1024)
    print(f"bench upstream listening on {HOST}:{port}", flush=True)
    await asyncio.Event().wait()


# ------------------------------------------------------------------------------------------- llmswap

# Runs llmswap's own lifecycle with a chosen event loop; everything else is what `llmswap --config` does.
LAUNCHER = """\
import sys
from pathlib import Path
from llmswap.config import load_config
from llmswap.server.lifecycle import ServeOptions, run
config_path, port, loop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
options = ServeOptions(config_path=Path(config_path), host="127.0.0.1", port=port)
raise SystemExit(run(options, load_config(config_path), event_loop=loop))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def write_config(folder: Path, upstream: str, port: int, concurrency: int) -> Path:
    if upstream == "raw":
        cmd = f"{sys.executable} -m bench.proxy_overhead --serve-upstream --port {port}"
    else:
        cmd = f"{sys.executable} -m llmswap.demo --port {port} --model-name {MODEL}"
    path = folder / "bench.yaml"
    path.write_text(json.dumps({  # JSON is YAML
        "healthCheckTimeout": 30,
        # The default concurrencyLimit (10) would answer 429 beyond 10 requests in flight.
        "models": {MODEL: {"cmd": cmd, "proxy": f"http://{HOST}:{port}",
                           "concurrencyLimit": max(concurrency, 10)}},
        "hooks": {"on_startup": {"preload": [MODEL]}},
    }))
    return path


@dataclass
class Llmswap:
    process: subprocess.Popen[bytes]
    url: str

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


REPO = Path(__file__).resolve().parent.parent  # the upstream runs as `-m bench.proxy_overhead` from here


async def start_llmswap(config: Path, loop: str, upstream_url: str) -> Llmswap:
    port = free_port()
    process = subprocess.Popen(  # noqa: ASYNC220 (started once, before anything is measured)
        [sys.executable, "-c", LAUNCHER, str(config), str(port), loop],
        stdout=subprocess.DEVNULL, start_new_session=True, cwd=REPO,
    )
    server = Llmswap(process, f"http://{HOST}:{port}")
    deadline = time.monotonic() + READY_WITHIN
    async with aiohttp.ClientSession() as http:
        # Ready when llmswap listens and the preloaded upstream answers.
        while True:
            if process.poll() is not None:
                raise SystemExit(f"llmswap exited with {process.returncode} during startup")
            try:
                async with http.get(f"{server.url}/health") as a, http.get(f"{upstream_url}/health") as b:
                    if a.status == 200 and b.status == 200:
                        return server
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                server.stop()
                raise SystemExit(f"llmswap or its upstream was not ready within {READY_WITHIN:g}s")
            await asyncio.sleep(0.05)


# ------------------------------------------------------------------------------------------- load


@dataclass
class Side:
    name: str
    url: str
    latencies: list[float] = field(default_factory=list)
    first_bytes: list[float] = field(default_factory=list)
    stream_latencies: list[float] = field(default_factory=list)
    throughputs: list[float] = field(default_factory=list)


async def one_request(http: aiohttp.ClientSession, url: str) -> float:
    began = time.perf_counter()
    async with http.post(f"{url}/v1/chat/completions", json=CHAT) as response:
        await response.read()
        if response.status != 200:
            raise SystemExit(f"{url}: status {response.status}")
    return time.perf_counter() - began


async def one_stream(http: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    began = time.perf_counter()
    async with http.post(f"{url}/v1/chat/completions", json=STREAM_CHAT) as response:
        await response.content.readany()
        first = time.perf_counter() - began
        await response.read()
        if response.status != 200:
            raise SystemExit(f"{url}: status {response.status}")
    return first, time.perf_counter() - began


async def latency_phase(http: aiohttp.ClientSession, sides: list[Side], requests: int) -> None:
    for block in range(0, requests, BLOCK):
        for side in sides if block // BLOCK % 2 == 0 else reversed(sides):
            for _ in range(min(BLOCK, requests - block)):
                side.latencies.append(await one_request(http, side.url))
                first, total = await one_stream(http, side.url)
                side.first_bytes.append(first)
                side.stream_latencies.append(total)


async def throughput_phase(http: aiohttp.ClientSession, sides: list[Side], requests: int,
                           concurrency: int) -> None:
    async def burst(url: str) -> float:
        remaining = requests

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await one_request(http, url)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return requests / (time.perf_counter() - began)

    for round_ in range(ROUNDS):
        for side in sides if round_ % 2 == 0 else reversed(sides):
            side.throughputs.append(await burst(side.url))


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def report(direct: Side, proxied: Side, loop: str, args: argparse.Namespace) -> None:
    rows: list[tuple[str, float, float, str]] = []

    def latency_row(label: str, a: list[float], b: list[float], q: int) -> None:
        da, db = percentile(a, q) * 1000, percentile(b, q) * 1000
        rows.append((label, da, db, f"+{db - da:.2f} ms   x{db / da:.2f}"))

    latency_row("latency p50 (ms)", direct.latencies, proxied.latencies, 50)
    latency_row("latency p99 (ms)", direct.latencies, proxied.latencies, 99)
    latency_row("stream first byte p50 (ms)", direct.first_bytes, proxied.first_bytes, 50)
    latency_row("stream whole p50 (ms)", direct.stream_latencies, proxied.stream_latencies, 50)
    latency_row("stream whole p99 (ms)", direct.stream_latencies, proxied.stream_latencies, 99)
    td, tp = statistics.median(direct.throughputs), statistics.median(proxied.throughputs)
    rows.append((f"throughput (req/s, {args.concurrency} in flight)", td, tp, f"x{tp / td:.2f} of direct"))

    print(f"\nevent loop in llmswap: {loop}")
    print(f"{'':38} {'direct':>10} {'via llmswap':>12}   added / ratio")
    for label, a, b, note in rows:
        print(f"{label:38} {a:10.2f} {b:12.2f}   {note}")


async def bench(args: argparse.Namespace) -> None:
    loops = ["asyncio", "uvloop"] if args.loop == "both" else [args.loop]
    cpu = platform.processor() or platform.machine()
    print(f"proxy overhead: {args.upstream} upstream, {args.requests} sequential requests per side "
          f"(x2: whole and streamed), {ROUNDS}x{args.throughput_requests} at concurrency {args.concurrency}; "
          f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, aiohttp {aiohttp.__version__}")
    for loop in loops:
        with tempfile.TemporaryDirectory() as folder:
            port = free_port()
            upstream_url = f"http://{HOST}:{port}"
            config = write_config(Path(folder), args.upstream, port, args.concurrency)
            server = await start_llmswap(config, loop, upstream_url)
            try:
                connector = aiohttp.TCPConnector(limit=max(args.concurrency, 1))
                async with aiohttp.ClientSession(connector=connector) as http:
                    direct, proxied = Side("direct", upstream_url), Side("via llmswap", server.url)
                    await latency_phase(http, [direct, proxied], args.warmup)  # warm-up, discarded
                    direct, proxied = Side("direct", upstream_url), Side("via llmswap", server.url)
                    await latency_phase(http, [direct, proxied], args.requests)
                    await throughput_phase(http, [direct, proxied], args.throughput_requests,
                                           args.concurrency)
                report(direct, proxied, loop, args)
            finally:
                server.stop()


def _uvloop_runner() -> Callable[[Awaitable[None]], None] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.run  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy_overhead",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000,
                        help="sequential requests per side (default 2000)")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up requests per side (default 200)")
    parser.add_argument("--throughput-requests", type=int, default=4000,
                        help="requests per throughput round (default 4000)")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight (default 32)")
    parser.add_argument("--loop", choices=("both", "asyncio", "uvloop"), default="both",
                        help="llmswap's event loop (default both, one after the other)")
    parser.add_argument("--upstream", choices=("raw", "demo"), default="raw",
                        help="raw: minimal aiohttp server (default); demo: llmswap's demo upstream")
    parser.add_argument("--serve-upstream", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    run_fast = _uvloop_runner() or asyncio.run
    if args.serve_upstream:
        run_fast(_serve_raw_upstream(args.port))
        return 0
    if args.loop != "asyncio" and _uvloop_runner() is None:
        if args.loop == "uvloop":
            parser.error("uvloop is not installed: pip install uvloop")
        print("uvloop is not installed (pip install uvloop): measuring asyncio's loop only")
        args.loop = "asyncio"
    # The load generator gets the fastest loop available: it must not be what limits either side.
    run_fast(bench(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
