"""What recording costs: latency and throughput through llmswap with activity and captures on, against the
same llmswap with recording off, in one run.

Run: `python -m bench.recording_cost [--requests 1000] [--throughput-requests 2000] [--concurrency 32]`.
Prints a table; asserts nothing. `python -m bench` includes its rows.

Two llmswap processes, each with its own copy of bench.proxy_overhead's minimal upstream (whose answers
carry `usage`, so the token reading does its full work): "on" runs as configured by default (activity in
memory, 5 MiB of captures); "off" runs the same code with `captureBuffer: 0` and the recorder replaced by
one that does nothing (`NullRecording`, below; llmswap itself has no switch to stop recording, as
llama-swap has none). Requests alternate between the two in blocks, so a shared machine's drift hits both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil

from bench import proxy_overhead
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
    """Accepts what the request path tells a recording and keeps nothing."""

    wants_request_body = False
    answered = False

    def __getattr__(self, name: str) -> object:
        return _nothing


def _nothing(*args: object, **kwargs: object) -> None:
    return None


def switch_recording_off() -> None:
    """Make the inference routes skip recording (for the "off" side only)."""
    from llmswap.server import cancel, inference

    inference.begin_http = lambda *args, **kwargs: NullRecording()  # type: ignore[assignment]
    cancel.finish_http = lambda *args, **kwargs: None  # type: ignore[assignment]


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
    """CPU time (user + system) llmswap's process has used so far."""
    times = psutil.Process(server.process.pid).cpu_times()
    return float(times.user + times.system)


async def measure(requests: int, throughput_requests: int, concurrency: int
                  ) -> tuple[Side, Side, int, dict[str, float]]:
    """(off, on, activity rows the "on" side recorded, CPU seconds per request of each side in the
    throughput phase)."""
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
                before = {name: cpu_seconds(server) for name, server in servers.items()}
                await proxy_overhead.throughput_phase(http, [off, on], throughput_requests, concurrency)
                served = throughput_requests * proxy_overhead.ROUNDS
                cpu = {name: (cpu_seconds(each) - before[name]) / served for name, each in servers.items()}
                async with http.get(f"{servers['on'].url}/api/metrics/activity?limit=1") as response:
                    recorded = int((await response.json())["total"])
        finally:
            for server in servers.values():
                server.stop()
    return off, on, recorded, cpu


async def recording_rows(requests: int, throughput_requests: int, concurrency: int) -> list[Row]:
    off, on, recorded, cpu = await measure(requests, throughput_requests, concurrency)
    against = "the same llmswap, recording off"
    rows = []
    for label, values in (("whole chat completion", "latencies"), ("streamed chat", "stream_latencies")):
        base, ours = (proxy_overhead.percentile(getattr(side, values), 50) for side in (off, on))
        rows.append(Row(f"recording on (activity + captures): latency p50, {label}, {requests} sequential",
                        against, ms(base), ms(ours), f"{ratio(ours, base)} ({(ours - base) * 1000:+.2f} ms)"))
    base, ours = (statistics.median(side.throughputs) for side in (off, on))
    rows.append(Row(f"recording on (activity + captures): throughput, {concurrency} in flight, median of 3 "
                    f"rounds ({recorded} rows kept)", against, per_second(base, "req"),
                    per_second(ours, "req"), ratio(ours, base)))
    # What a shared machine's load disturbs least: the CPU each llmswap spent per request it served.
    rows.append(Row("recording on (activity + captures): llmswap's CPU time per request, throughput phase",
                    against, f"{cpu['off'] * 1e6:.0f} us", f"{cpu['on'] * 1e6:.0f} us",
                    ratio(cpu["on"], cpu["off"])))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recording_cost",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="sequential requests per side and kind")
    parser.add_argument("--throughput-requests", type=int, default=2000, help="requests per round and side")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    args = parser.parse_args(argv)
    rows = asyncio.run(recording_rows(args.requests, args.throughput_requests, args.concurrency))
    print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
