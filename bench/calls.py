"""The work a warm request costs the server, counted instead of timed: Python calls (functions and builtins)
on the serving thread, llmswap against the bare aiohttp proxy, in one run.

Run: `python -m bench.calls [--requests 50]`. Prints a markdown table; asserts nothing. Not part of `python -m
bench`. On the 2-vCPU VMs here the CPU time of one build's warm request, read against the bare proxy's, moved
from x1.31 to x1.86 between runs (docs/benchmarks.md): wider than any change to the request path. A count of
calls does not move with the machine, so two builds can be told apart by it where timing cannot; it weighs a
builtin like `len` as much as a Python function, so it is a measure of work, not of time.

Each server runs on this process's event loop, in turn: the bare proxy (`bench.bare_proxy`'s app) and then
llmswap as `llmswap --config` builds it (its lifecycle's `Server`, logging to stdout, here a string), each in
front of `bench.proxy_overhead`'s minimal upstream. A client on another thread (`http.client`, one keep-alive
connection; `sys.setprofile` counts the serving thread only) sends warm-up requests, then `--requests` whole
chat completions while every call on the loop's thread is counted, for as long again after the last answer as
llmswap's recorder takes to keep its rows; the same length of time with no request is counted too and taken
off (timers that run whether or not requests come).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import io
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from aiohttp import web

from bench import bare_proxy, proxy_overhead
from bench.launch import HOST, free_port, wait_answering
from bench.report import Row, print_report, ratio

WARM_UP = 30
AFTER = 0.2  # seconds counted after the last answer: the recorder keeps rows within SETTLE_AFTER (50 ms)
BODY = json.dumps(proxy_overhead.CHAT).encode()
PACKAGES = ("llmswap", "aiohttp", "asyncio")  # the rest: multidict, yarl, the standard library...


def package_of(filename: str) -> str:
    for package in PACKAGES:
        if f"/{package}/" in filename:
            return package
    return "other"


def _client(port: int, requests: int) -> None:
    connection = http.client.HTTPConnection(HOST, port, timeout=30)
    try:
        for _ in range(requests):
            connection.request("POST", "/v1/chat/completions", BODY, {"Content-Type": "application/json"})
            answer = connection.getresponse()
            answer.read()
            if answer.status != 200:
                raise SystemExit(f"the server answered {answer.status}")
    finally:
        connection.close()


async def _requests(port: int, requests: int) -> None:
    """`requests` chat completions from a client thread; the loop waits on one future meanwhile."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[BaseException | None] = loop.create_future()

    def send() -> None:
        try:
            _client(port, requests)
        except BaseException as exc:  # handed back to the loop
            loop.call_soon_threadsafe(done.set_result, exc)
        else:
            loop.call_soon_threadsafe(done.set_result, None)

    threading.Thread(target=send, name="bench-client", daemon=True).start()
    failed = await done
    if failed is not None:
        raise SystemExit(f"the client failed: {failed}")


@contextlib.contextmanager
def counting(into: Counter[str]) -> Iterator[None]:
    """Count every call on this thread by the package its caller's or callee's code is in."""

    def profile(frame: FrameType, event: str, _: Any) -> None:
        if event == "call":
            into[package_of(frame.f_code.co_filename)] += 1
        elif event == "c_call":
            into["builtins called from " + package_of(frame.f_code.co_filename)] += 1

    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(None)


async def calls_per_request(port: int, requests: int) -> dict[str, float]:
    await _requests(port, WARM_UP)
    busy: Counter[str] = Counter()
    began = time.perf_counter()
    with counting(busy):
        await _requests(port, requests)
        await asyncio.sleep(AFTER)
    idle: Counter[str] = Counter()
    with counting(idle):
        await asyncio.sleep(time.perf_counter() - began)
    return {kind: (busy[kind] - idle[kind]) / requests for kind in busy}


@contextlib.asynccontextmanager
async def upstream() -> AsyncIterator[str]:
    port = free_port()
    process = subprocess.Popen(  # noqa: ASYNC220 (started once, before anything is counted)
        [sys.executable, "-m", "bench.proxy_overhead", "--serve-upstream", "--port", str(port)],
        stdout=subprocess.DEVNULL, start_new_session=True, cwd=proxy_overhead.REPO,
    )
    url = f"http://{HOST}:{port}"
    try:
        await wait_answering(process, [f"{url}/health"], "the bench upstream")
        yield url
    finally:
        process.terminate()
        process.wait(10)


async def count_bare(requests: int) -> dict[str, float]:
    async with upstream() as url:
        runner = web.AppRunner(bare_proxy.app(url), access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, HOST, port).start()
        try:
            return await calls_per_request(port, requests)
        finally:
            await runner.cleanup()


async def count_llmswap(folder: Path, requests: int) -> dict[str, float]:
    from llmswap.config import load_config
    from llmswap.server.lifecycle import ServeOptions, Server, settle_garbage_collector

    upstream_port, port = free_port(), free_port()
    config_path = proxy_overhead.write_config(folder, "raw", upstream_port, 10)
    with contextlib.redirect_stdout(io.StringIO()):  # its log lines, printed as usual, kept here
        server = Server(ServeOptions(config_path=config_path, host=HOST, port=port), load_config(config_path))
        await server.start()
        settle_garbage_collector()  # as `llmswap --config` does once it serves
        try:
            await _until_answering(port)
            return await calls_per_request(port, requests)
        finally:
            await server.stop()


async def _until_answering(port: int, within: float = 30.0) -> None:
    """The preloaded upstream is up once a chat completion through llmswap answers 200."""
    deadline = time.monotonic() + within
    while True:
        try:
            await asyncio.to_thread(_client, port, 1)
            return
        except (OSError, SystemExit):
            if time.monotonic() > deadline:
                raise SystemExit(f"llmswap did not answer within {within:g}s") from None
            await asyncio.sleep(0.1)


def rows(bare: dict[str, float], ours: dict[str, float], requests: int) -> list[Row]:
    def total(counts: dict[str, float], pick: Callable[[str], bool] = lambda _: True) -> float:
        return sum(value for kind, value in counts.items() if pick(kind))

    each = f"a warm whole chat completion, {requests} sequential, the serving thread"
    table = [Row(f"Python calls (functions and builtins) per request: {each}",
                 "bare aiohttp proxy (bench.bare_proxy), same run", f"{total(bare):.0f}",
                 f"{total(ours):.0f}", ratio(total(ours), total(bare)))]
    for package in (*PACKAGES, "other"):
        def mine(kind: str, package: str = package) -> bool:
            return kind in (package, f"builtins called from {package}")

        if package == "llmswap":
            table.append(Row(f"of which llmswap's own code and the builtins it calls: {each}",
                             "bare aiohttp proxy (has none)", "0", f"{total(ours, mine):.0f}", "n/a"))
            continue
        table.append(Row(f"of which {package}'s code and the builtins it calls: {each}",
                         "bare aiohttp proxy (bench.bare_proxy), same run", f"{total(bare, mine):.0f}",
                         f"{total(ours, mine):.0f}", ratio(total(ours, mine), total(bare, mine))))
    return table


async def measure(requests: int) -> list[Row]:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        bare = await count_bare(requests)
        ours = await count_llmswap(folder, requests)
    return rows(bare, ours, requests)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.calls", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--requests", type=int, default=50, help="requests counted per server")
    args = parser.parse_args(argv)
    began = time.monotonic()
    print_report(asyncio.run(measure(args.requests)), "python -m bench.calls", began)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
