"""What recording costs: latency, throughput and llmswap's CPU per request with activity and captures on,
against the same llmswap with recording off, in one run.

Run: `python -m bench.recording_cost [--requests 1000] [--throughput-requests 2000] [--concurrency 32]
[--seconds 3]`. Prints a table; asserts nothing. `python -m bench` includes its rows.

Two llmswap processes, each with its own copy of bench.proxy_overhead's minimal upstream (whose answers
carry `usage`, so the token reading does its full work): "on" runs as configured by default (activity in
memory, 5 MiB of captures); "off" runs the same code with `captureBuffer: 0` and every request path's
recording replaced by one that does nothing (`switch_recording_off`, below; llmswap itself has no switch to
stop recording, as llama-swap has none). The "off" side must end with no activity row, or the benchmark
stops: a path the switch missed would make the comparison flatter recording.

Latency: sequential requests (whole and streamed) alternating between the two in blocks. Throughput: wrk
(when installed; its own cost then stays out of the way) or else this process's aiohttp client, rounds
alternating between the sides, so a shared machine's drift hits both. The steadiest figure on a loaded
machine is llmswap's own CPU time per request served (psutil, each side's process during its own rounds):
what recording costs the proxy, whatever else runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil

from bench import proxy_overhead, wrk_nginx
from bench.launch import Llmswap, wait_ready
from bench.proxy_overhead import HOST, Side, free_port
from bench.report import Row, markdown_table, ms, per_second, ratio

# llmswap's lifecycle, as `llmswap --config` runs it; with "off", the inference routes record nothing.
LAUNCHER = """\
import sys
from pathlib import Path
from llmswap.config import load_config
from llmswap.server.lifecycle import ServeOptions, run
config_path, port, recording = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if recording == "off":
    from bench.recording_cost import switch_recording_off
    switch_recording_off()
options = ServeOptions(config_path=Path(config_path), host="127.0.0.1", port=port)
raise SystemExit(run(options, load_config(config_path), event_loop="asyncio"))
"""


class NullRecording:
    """Accepts what the request path tells a recording and keeps nothing, each call as cheap as a call can
    be (a `__getattr__` fallback would charge the "off" side more than nothing). Its methods are
    `Recording`'s, parameter for parameter (tests/unit/test_bench_recording_off.py keeps them so)."""

    __slots__ = ()
    wants_request_body = False
    answered = False

    def request_body(self, body: object) -> None:
        pass

    def fail(self, status: object, message: object) -> None:
        pass

    def client_left(self) -> None:
        pass

    def response_headers(self, status: object, headers: object) -> None:
        pass

    def chunk(self, data: object) -> None:
        pass

    def finish(self, status: object = None, *, content_type: object = None, body: object = None,
               error: object = None) -> None:
        pass

    def finish_soon(self, status: object = None, *, content_type: object = None, body: object = None,
                    error: object = None) -> None:
        pass

    def cached_tokens(self) -> None:
        return None


NULL_RECORDING = NullRecording()


def _nothing(*args: object, **kwargs: object) -> None:
    return None


def switch_recording_off() -> None:
    """Make every request path record nothing (for the "off" side only): `begin_http`/`finish_http` wherever
    a module imported them, and the recorder's own `begin` (tasks and batch requests)."""
    import importlib
    import pkgutil

    import llmswap.server
    from llmswap.activity.recorder import ActivityRecorder
    from llmswap.server.inference import inflight

    nothing = {"begin_http": lambda *args, **kwargs: NULL_RECORDING, "finish_http": _nothing}
    originals = {name: getattr(inflight, name) for name in nothing}
    for found in pkgutil.walk_packages(llmswap.server.__path__, "llmswap.server."):
        module = importlib.import_module(found.name)
        for name, original in originals.items():
            if getattr(module, name, None) is original:
                setattr(module, name, nothing[name])
    ActivityRecorder.begin = lambda self, facts, record=None: NULL_RECORDING  # type: ignore[assignment,method-assign]


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str

    def stop(self) -> None:
        proxy_overhead.Llmswap(self.process, self.url).stop()


def write_config(folder: Path, name: str, upstream_port: int, concurrency: int, capture_mb: int) -> Path:
    path = proxy_overhead.write_config(folder, "raw", upstream_port, concurrency)
    document = json.loads(path.read_text())
    document["captureBuffer"] = capture_mb
    target = folder / f"{name}.yaml"
    target.write_text(json.dumps(document))
    return target


async def start(config: Path, recording: str, upstream_port: int) -> Server:
    port = free_port()
    process = subprocess.Popen(  # noqa: ASYNC220 (started once, before anything is measured)
        [sys.executable, "-c", LAUNCHER, str(config), str(port), recording],
        stdout=subprocess.DEVNULL, start_new_session=True, cwd=proxy_overhead.REPO,
    )
    server = Server(process, f"http://{HOST}:{port}")
    try:
        await wait_ready(Llmswap(process, server.url), [f"{server.url}/health",
                                                        f"http://{HOST}:{upstream_port}/health"])
    except SystemExit as failed:
        server.stop()
        raise SystemExit(f"llmswap ({recording}): {failed}") from None
    return server


def cpu_seconds(server: Server) -> float:
    """CPU time (user + system) llmswap's process has used so far (its upstream's not included)."""
    times = psutil.Process(server.process.pid).cpu_times()
    return float(times.user + times.system)


@dataclass
class Rounds:
    """One side's throughput rounds: requests per second, and llmswap's CPU seconds per request."""

    rates: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)  # wrk's, seconds (wrk only)


async def burst(http: aiohttp.ClientSession, url: str, requests: int, concurrency: int) -> float:
    """`requests` whole chat completions, `concurrency` at a time: requests per second."""
    remaining = requests

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await proxy_overhead.one_request(http, url)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return requests / (time.perf_counter() - began)


async def rows_recorded(http: aiohttp.ClientSession, server: Server) -> int:
    async with http.get(f"{server.url}/api/metrics/activity?limit=1") as response:
        return int((await response.json())["total"])


async def throughput_rounds(http: aiohttp.ClientSession, servers: dict[str, Server], throughput_requests: int,
                            concurrency: int, seconds: float, folder: Path) -> tuple[dict[str, Rounds], str]:
    """ROUNDS rounds per side, alternating, with wrk when installed: (rounds by side, how the load was
    made)."""
    rounds = {name: Rounds() for name in servers}
    wrk_path = wrk_nginx.find("wrk")
    script = wrk_nginx.post_script(folder) if wrk_path else None
    for round_ in range(proxy_overhead.ROUNDS):
        for name in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
            server = servers[name]
            before = cpu_seconds(server)
            if script is not None:
                url = f"{server.url}/v1/chat/completions"
                result = await wrk_nginx.wrk(url, concurrency, seconds, script)
                if result.errors:
                    raise SystemExit(f"llmswap ({name}): wrk counted {result.errors} errors")
                served = result.requests_per_second * seconds
                rounds[name].rates.append(result.requests_per_second)
                rounds[name].p50.append(result.p50)
            else:
                served = throughput_requests
                rounds[name].rates.append(await burst(http, server.url, served, concurrency))
            rounds[name].cpu.append((cpu_seconds(server) - before) / served)
    how = (f"wrk -c{concurrency}, {seconds:g} s" if script is not None
           else f"aiohttp client, {concurrency} in flight, {throughput_requests} requests")
    return rounds, how + f" a round, {proxy_overhead.ROUNDS} rounds a side"


async def measure(requests: int, throughput_requests: int, concurrency: int, seconds: float
                  ) -> tuple[Side, Side, dict[str, Rounds], str, int]:
    """(off, on, throughput rounds by side, how the load was made, activity rows the "on" side kept)."""
    with tempfile.TemporaryDirectory() as folder:
        ports = {"off": free_port(), "on": free_port()}
        configs = {"off": write_config(Path(folder), "off", ports["off"], concurrency, 0),
                   "on": write_config(Path(folder), "on", ports["on"], concurrency, 5)}
        servers = {}
        try:
            for name in ("off", "on"):
                servers[name] = await start(configs[name], name, ports[name])
            connector = aiohttp.TCPConnector(limit=max(concurrency, 1))
            async with aiohttp.ClientSession(connector=connector) as http:
                warm = [Side("off", servers["off"].url), Side("on", servers["on"].url)]
                await proxy_overhead.latency_phase(http, warm, max(20, requests // 10))
                off, on = Side("off", servers["off"].url), Side("on", servers["on"].url)
                await proxy_overhead.latency_phase(http, [off, on], requests)
                rounds, how = await throughput_rounds(http, servers, throughput_requests, concurrency,
                                                      seconds, Path(folder))
                leaked = await rows_recorded(http, servers["off"])
                if leaked:
                    raise SystemExit(f"the \"off\" llmswap recorded {leaked} activity rows: a request "
                                     "path records without begin_http/finish_http, and switch_recording_off "
                                     "must cover it")
                recorded = await rows_recorded(http, servers["on"])
        finally:
            for server in servers.values():
                server.stop()
    return off, on, rounds, how, recorded


def _spread(values: list[float]) -> str:
    return f"{min(values):.3g}..{max(values):.3g}"


async def recording_rows(requests: int, throughput_requests: int, concurrency: int,
                         seconds: float = 3.0) -> list[Row]:
    off, on, rounds, how, recorded = await measure(requests, throughput_requests, concurrency, seconds)
    against = "the same llmswap, recording off"
    title = "recording on (activity + captures)"
    rows = []
    for label, values in (("whole chat completion", "latencies"), ("streamed chat", "stream_latencies")):
        base, ours = (proxy_overhead.percentile(getattr(side, values), 50) for side in (off, on))
        rows.append(Row(f"{title}: latency p50, {label}, {requests} sequential", against, ms(base), ms(ours),
                        f"{ratio(ours, base)} ({(ours - base) * 1000:+.3f} ms)"))
    base, ours = (statistics.median(rounds[name].rates) for name in ("off", "on"))
    by_round = [on_rate / off_rate for on_rate, off_rate in zip(rounds["on"].rates, rounds["off"].rates,
                                                                 strict=True)]
    rows.append(Row(f"{title}: throughput, {how}, median ({recorded} rows kept; on/off by round "
                    f"{_spread(by_round)})", against, per_second(base, "req"), per_second(ours, "req"),
                    ratio(ours, base)))
    if rounds["on"].p50:
        base, ours = (statistics.median(rounds[name].p50) for name in ("off", "on"))
        rows.append(Row(f"{title}: latency p50 under that load (wrk), median of rounds", against, ms(base),
                        ms(ours), f"{ratio(ours, base)} ({(ours - base) * 1000:+.3f} ms)"))
    # What a shared machine's load disturbs least: the CPU each llmswap spent per request it served.
    base, ours = (statistics.median(rounds[name].cpu) for name in ("off", "on"))
    by_round = [on_cpu / off_cpu for on_cpu, off_cpu in zip(rounds["on"].cpu, rounds["off"].cpu, strict=True)]
    rows.append(Row(f"{title}: llmswap's CPU per request, off / on, throughput rounds, median (on/off by "
                    f"round {_spread(by_round)}; recording adds {(ours - base) * 1e6:+.1f} us)", against,
                    f"{base * 1e6:.0f} us", f"{ours * 1e6:.0f} us", ratio(ours, base)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recording_cost",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="sequential requests per side and kind")
    parser.add_argument("--throughput-requests", type=int, default=2000, help="requests per round and side")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds a wrk round lasts")
    args = parser.parse_args(argv)
    measuring = recording_rows(args.requests, args.throughput_requests, args.concurrency, args.seconds)
    rows = asyncio.run(measuring)
    print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
