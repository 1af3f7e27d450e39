"""A real llama.cpp upstream: tokens/s and time to first token of llama-cpp-python's server, read directly and
through llmswap in the same run.

The model is the generated `medium` GGUF of tests/helpers/gguf_model.py (random weights, 8 layers, 512 wide:
about 24M parameters), served on one thread; nothing is downloaded. Greedy decoding of a fixed prompt makes
both sides generate the same tokens. Skipped, with a row saying so, when llama-cpp-python is not installed
(.ci/install-llama-cpp.sh installs it).
"""

from __future__ import annotations

import importlib.util
import shlex
import tempfile
from pathlib import Path

import aiohttp

from bench.launch import HOST, free_port, running_llmswap, write_config
from bench.relay import alternate, median_by_side
from bench.report import Row, ms, per_second, ratio

MODEL = "medium"
MEASURES = ("real llama.cpp upstream: tokens/s while generating",
            "real llama.cpp upstream: time to first token")
NOT_INSTALLED = "llama-cpp-python not installed"
CONTEXT = 512  # prompt + the longest generation asked for


def installed() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("llama_cpp", "uvicorn", "fastapi"))


def llama_cpp_version() -> str | None:
    if not installed():
        return None
    import llama_cpp

    return str(llama_cpp.__version__)


async def llama_cpp_tokens(tokens: int, rounds: int) -> list[Row]:
    if not installed():
        return [Row.skipped(measure, NOT_INSTALLED) for measure in MEASURES]
    if not 8 <= tokens <= CONTEXT - 64:
        raise ValueError(f"tokens: from 8 to {CONTEXT - 64} fit the model's context, got {tokens}")
    # Imported here: the generator needs numpy and gguf, which only the test extra installs.
    from tests.helpers.gguf_model import SIZES, llama_cpp_server_argv, tiny_llama

    body = {"model": MODEL, "max_tokens": tokens, "temperature": 0, "seed": 1,
            "messages": [{"role": "user", "content": "Tell me a long story about a llama."}]}
    with tempfile.TemporaryDirectory() as folder:
        gguf = tiny_llama(SIZES[MODEL], Path(folder))
        port = free_port()
        argv = llama_cpp_server_argv(gguf, MODEL, port, context=CONTEXT, embeddings=False)
        entry = {"cmd": shlex.join(argv),
                 "proxy": f"http://{HOST}:{port}", "checkEndpoint": "/v1/models"}
        config = write_config(Path(folder) / "llamacpp.yaml", {MODEL: entry}, preload=[MODEL])
        direct = f"http://{HOST}:{port}"
        async with running_llmswap(config, [f"{direct}/v1/models"]) as server:
            timeout = aiohttp.ClientTimeout(total=300)
            async with aiohttp.ClientSession(timeout=timeout) as http:
                urls = {"direct": direct, "llmswap": server.url}
                await alternate(http, urls, {**body, "max_tokens": 8}, rounds=1)  # warm-up
                timings = await alternate(http, urls, body, rounds)
    speed = median_by_side(timings, lambda t: t.decode_tokens_per_second)
    first = median_by_side(timings, lambda t: t.first_token - t.began)
    label = f"{tokens} tokens, median of {rounds}"
    return [
        Row(f"{MEASURES[0]} ({label})", "direct to llama_cpp.server",
            per_second(speed["direct"], "tokens"), per_second(speed["llmswap"], "tokens"),
            ratio(speed["llmswap"], speed["direct"])),
        Row(f"{MEASURES[1]} ({label})", "direct to llama_cpp.server", ms(first["direct"]),
            ms(first["llmswap"]), f"{ratio(first['llmswap'], first['direct'])} "
                                  f"({(first['llmswap'] - first['direct']) * 1000:+.2f} ms)"),
    ]
