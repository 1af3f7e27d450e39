"""A real llama.cpp upstream: tokens/s and time to first token of llama.cpp's own llama-server, read directly
and through llmswap in the same run.

The model is the generated `medium` GGUF of tests/helpers/gguf_model.py (random weights, 8 layers, 512 wide:
about 24M parameters), served on one thread; nothing is downloaded. Greedy decoding of a fixed prompt makes
both sides generate the same tokens. Skipped, with a row saying so, when llama-server is not installed
(.ci/install-llama-server.sh builds it).
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile
from pathlib import Path

import aiohttp

from bench.launch import HOST, free_port, running_llmswap, write_config
from bench.relay import alternate, median_by_side
from bench.report import Row, ms, per_second, ratio

MODEL = "medium"
MEASURES = ("real llama.cpp upstream: tokens/s while generating",
            "real llama.cpp upstream: time to first token")
NOT_INSTALLED = "llama-server not installed"
CONTEXT = 512  # prompt + the longest generation asked for


def binary() -> str | None:
    from tests.helpers.llama_server import llama_server_binary

    return llama_server_binary()


def llama_cpp_version() -> str | None:
    """llama-server's own version line, when it is installed."""
    found = binary()
    if found is None:
        return None
    shown = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30, check=False)
    lines = (shown.stdout + shown.stderr).strip().splitlines()
    return lines[0].removeprefix("version: ") if lines else "unknown"


async def llama_cpp_tokens(tokens: int, rounds: int) -> list[Row]:
    server = binary()
    if server is None:
        return [Row.skipped(measure, NOT_INSTALLED) for measure in MEASURES]
    if not 8 <= tokens <= CONTEXT - 64:
        raise ValueError(f"tokens: from 8 to {CONTEXT - 64} fit the model's context, got {tokens}")
    # Imported here: the generator needs numpy and gguf, which only the test extra installs.
    from tests.helpers.gguf_model import SIZES, tiny_llama
    from tests.helpers.llama_server import llama_server_argv

    body = {"model": MODEL, "max_tokens": tokens, "temperature": 0, "seed": 1,
            "messages": [{"role": "user", "content": "Tell me a long story about a llama."}]}
    with tempfile.TemporaryDirectory() as folder:
        gguf = tiny_llama(SIZES[MODEL], Path(folder))
        port = free_port()
        argv = llama_server_argv(server, gguf, context=CONTEXT, port=str(port), kv_dir=None, alias=MODEL)
        entry = {"cmd": shlex.join(argv), "proxy": f"http://{HOST}:{port}"}
        config = write_config(Path(folder) / "llamacpp.yaml", {MODEL: entry}, preload=[MODEL])
        direct = f"http://{HOST}:{port}"
        async with running_llmswap(config, [f"{direct}/health"]) as llmswap:
            timeout = aiohttp.ClientTimeout(total=300)
            # A fresh connection per stream, on both sides alike: llama-server closes idle keep-alive
            # connections on its own schedule, and aiohttp's client does not resend a POST whose pooled
            # connection the server was closing (a full run failed so once).
            connector = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
                urls = {"direct": direct, "llmswap": llmswap.url}
                await alternate(http, urls, {**body, "max_tokens": 8}, rounds=1)  # warm-up
                timings = await alternate(http, urls, body, rounds)
    speed = median_by_side(timings, lambda t: t.decode_tokens_per_second)
    first = median_by_side(timings, lambda t: t.first_token - t.began)
    label = f"{tokens} tokens, median of {rounds}"
    return [
        Row(f"{MEASURES[0]} ({label})", "direct to llama-server",
            per_second(speed["direct"], "tokens"), per_second(speed["llmswap"], "tokens"),
            ratio(speed["llmswap"], speed["direct"])),
        Row(f"{MEASURES[1]} ({label})", "direct to llama-server", ms(first["direct"]),
            ms(first["llmswap"]), f"{ratio(first['llmswap'], first['direct'])} "
                                  f"({(first['llmswap'] - first['direct']) * 1000:+.2f} ms)"),
    ]
