"""`kvCache.save: auto` against `always`, with a real llmswap and demo upstreams that speak llama-server's
slot API (`--slot-save-path`): the saves are real files in the model's folder, their times the disk's.

`m` processes prompts as fast as it can and holds 1 MiB of KV per token, so once llmswap has measured a
save, a restore and a prompt, processing a slot's tokens again is far cheaper than writing and reading
them: `auto` stops saving it (counted, logged, shown with the rates at /api/kvcache); `always` saves it
every time. `other` is the model a swap goes to.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers.cli import LlmswapProcess, demo_model, running_llmswap, write_config

PROMPT = " ".join(["word"] * 40)


def kv_model(model_id: str) -> dict[str, Any]:
    return demo_model(model_id, "--slot-save-path", "${KV_DIR}", "--kv-bytes-per-token", "1MiB",
                      kvCache=True)


async def chat(http: aiohttp.ClientSession, server: LlmswapProcess, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2}
    async with http.post(f"{server.url}/v1/chat/completions", json=body) as response:
        assert response.status == 200, await response.text()


async def get_json(http: aiohttp.ClientSession, server: LlmswapProcess, path: str) -> Any:
    async with http.get(f"{server.url}{path}") as response:
        assert response.status == 200
        return await response.json() if "json" in response.content_type else await response.text()


@pytest.mark.parametrize("mode", ["auto", "always"])
async def test_a_save_that_does_not_pay_is_skipped_with_auto_and_made_with_always(
        tmp_path: Path, mode: str) -> None:
    models = {"m": kv_model("m"), "other": demo_model("other")}
    config = write_config(tmp_path / "config.yaml", models, logLevel="info",
                          kvCache={"dir": str(tmp_path / "kv"), "save": mode})
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        await chat(http, server, "m")  # the prompt rate is learned from its timings
        await chat(http, server, "other")  # m saved: nothing measured yet says it would not pay
        await chat(http, server, "m")  # restored: the read rate is measured too
        await chat(http, server, "other")  # the choice, from measured rates
        listing = await get_json(http, server, "/api/kvcache")
        metrics = await get_json(http, server, "/metrics")
        output = server.stdout_lines + server.stderr_lines

    record = next(r for r in listing["models"] if r["model"] == "m")
    rates = record["rates"]
    assert listing["save"] == mode
    assert rates["prompt_tokens_per_second"] > 0 and rates["bytes_per_token"] == 1024 * 1024
    assert rates["save_bytes_per_second"] > 0 and rates["restore_bytes_per_second"] > 0
    saved_lines = [line for line in output if "[m] kv cache: saved 1 slot(s)" in line]
    skipped_lines = [line for line in output if "[m] kv cache: slot 0 not saved: processing" in line]
    if mode == "auto":
        assert len(saved_lines) == 1 and len(skipped_lines) == 1, "\n".join(output)
        assert rates["skipped_saves"] == 1
        assert 'llmswap_kvcache_skipped_saves_total{model="m"} 1.0' in metrics
    else:
        assert len(saved_lines) == 2 and skipped_lines == [], "\n".join(output)
        assert rates["skipped_saves"] == 0
        assert "llmswap_kvcache_skipped_saves_total{" not in metrics
