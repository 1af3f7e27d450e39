"""The modules of llmswap a warm request passes through, in the order it first enters each.

Run: `python -m bench.warm_path [--stream]`. Serves a demo model in this process (llmswap's own app, as
`llmswap --config` builds it), sends a few chat completions to warm it, then records every Python call made
while one more is served (`sys.setprofile`), and prints the llmswap modules those calls ran in: the length
of the path a request takes through the code, which `docs/benchmarks.md` reports. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
from aiohttp import web

import llmswap
from bench.launch import HOST, free_port
from llmswap.config import load_config
from llmswap.router import build_router
from llmswap.server.app import create_app
from llmswap.server.http.connections import Runner
from llmswap.server.state import ServerState

PACKAGE = Path(llmswap.__file__).parent
CHAT = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


def module_of(filename: str) -> str | None:
    path = Path(filename)
    if not path.is_relative_to(PACKAGE):
        return None
    return str(path.relative_to(PACKAGE))


async def trace(stream: bool) -> list[str]:
    with tempfile.TemporaryDirectory() as folder:
        port = free_port()
        config_path = Path(folder) / "warm.yaml"
        config_path.write_text(
            f"models:\n  m:\n    cmd: {sys.executable} -m llmswap.demo --port {port} --model-name m "
            f"--tokens-per-second 0\n    proxy: http://{HOST}:{port}\n")
        config = load_config(config_path)
        router = build_router(config)
        state = ServerState(config=config, router=router)
        router.start()
        app = create_app(state)
        runner = Runner(app, header_timeout=lambda: config.client_header_timeout, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, HOST, 0)
        await site.start()
        url = f"http://{HOST}:{runner.addresses[0][1]}/v1/chat/completions"
        body = {**CHAT, "stream": stream}
        try:
            async with aiohttp.ClientSession() as http:
                for _ in range(3):  # the model started, connections open, every lazy import done
                    async with http.post(url, json=body) as response:
                        await response.read()
                seen: dict[str, None] = {}

                def profile(frame: FrameType, event: str, _: Any) -> None:
                    if event == "call":
                        module = module_of(frame.f_code.co_filename)
                        if module is not None:
                            seen.setdefault(module, None)

                sys.setprofile(profile)
                try:
                    async with http.post(url, json=body) as response:
                        await response.read()
                    await asyncio.sleep(0.2)  # what runs after the answer: the access line, the activity row
                finally:
                    sys.setprofile(None)
        finally:
            await runner.cleanup()
            await router.shutdown(2.0)
    return list(seen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.warm_path",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--stream", action="store_true", help="a streamed chat completion")
    args = parser.parse_args(argv)
    modules = asyncio.run(trace(args.stream))
    for index, module in enumerate(modules, 1):
        print(f"{index:3} {module}")
    kind = "streamed" if args.stream else "whole"
    print(f"\n{len(modules)} llmswap modules for a warm {kind} chat completion")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
