"""The generated GGUF models (tests/helpers/gguf_model.py) as llama-server runs them: they load, tokenize any
text, and only ever sample visible text, never an end token."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.helpers.demo import free_port
from tests.helpers.gguf_model import SIZES, tiny_llama
from tests.helpers.llama_server import llama_server_argv
from tests.helpers.wait import eventually

pytestmark = pytest.mark.llamaserver


async def test_llama_server_loads_it_and_samples_only_visible_text(llama_server: str, tmp_path: Path) -> None:
    port = free_port()
    argv = llama_server_argv(llama_server, tiny_llama(SIZES["tiny"], tmp_path), context=128, port=str(port),
                             kv_dir=None, alias="tiny")
    process = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL,
                                                   stderr=asyncio.subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            async def healthy() -> bool:
                try:
                    async with http.get(f"{url}/health") as response:
                        return response.status == 200
                except aiohttp.ClientError:
                    return False

            await eventually(healthy, within=60, what="llama-server's /health")
            async with http.post(f"{url}/tokenize", json={"content": "Hello, world!"}) as response:
                tokens = (await response.json())["tokens"]
            async with http.post(f"{url}/detokenize", json={"tokens": tokens}) as response:
                assert (await response.json())["content"].strip() == "Hello, world!"
            for seed in range(3):
                body = {"prompt": "Once upon a time", "n_predict": 24, "temperature": 1.5, "seed": seed}
                async with http.post(f"{url}/completion", json=body) as response:
                    answer = await response.json()
                assert answer["stop_type"] == "limit" and answer["tokens_predicted"] == 24
                assert answer["content"] and all(0x20 <= ord(c) < 0x7F for c in answer["content"])
    finally:
        process.terminate()
        await process.wait()
