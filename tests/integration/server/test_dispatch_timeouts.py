"""Tasks and batch requests take the HTTP path to their model: its `timeouts`, exactly, and no other limit.

The demo upstream answers slowly on purpose (`--tokens-per-second`), so its answer comes after a short
`timeouts.responseHeader` but well within a long one; with none set, nothing cuts it off (a task used to
run on a bare aiohttp session, whose 300 s default failed long generations that HTTP served fine).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from llmswap.config.model import Config, TasksConfig, TaskTypeConfig, Timeouts
from tests.helpers.models import demo_config
from tests.helpers.wait import eventually
from tests.integration.server.conftest import ServeConfig, Served

RATE = "20"  # tokens per second
TOKENS = 8  # so an answer takes about 0.4 s after the request arrives
SHORT = 0.1  # a responseHeader limit the answer cannot meet


def slow_config(tmp_path: Path, response_header: float) -> Config:
    limits = Timeouts(response_header=response_header)
    model = demo_config("slow", "--tokens-per-second", RATE, timeouts=limits)
    tasks = TasksConfig(db=tmp_path / "tasks.sqlite", types={"essay": TaskTypeConfig("essay", "slow")})
    return Config(models={"slow": model}, tasks=tasks)


def chat(model: str = "slow") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "write"}], "max_tokens": TOKENS}


async def run_task(http: aiohttp.ClientSession, served: Served) -> dict[str, Any]:
    body = {"type": "essay", "params": {k: v for k, v in chat().items() if k != "model"}}
    async with http.post(served.at("/api/tasks"), json=body) as resp:
        assert resp.status == 201, await resp.text()
        task_id = (await resp.json())["id"]
    row: dict[str, Any] = {}

    async def ended() -> bool:
        nonlocal row
        async with http.get(served.at(f"/api/tasks/{task_id}")) as resp:
            row = await resp.json()
        return row["status"] in ("completed", "failed")

    await eventually(ended, within=30, interval=0.05, what=f"task {task_id} to end")
    return row


async def run_batch(served: Served) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The output and error records of a one-request batch."""
    async with AsyncOpenAI(base_url=served.at("/v1"), api_key="unused", max_retries=0, timeout=30) as openai:
        line = json.dumps({"custom_id": "one", "method": "POST", "url": "/v1/chat/completions",
                           "body": chat()})
        uploaded = await openai.files.create(file=("in.jsonl", (line + "\n").encode()), purpose="batch")
        batch = await openai.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )

        async def completed() -> bool:
            nonlocal batch
            batch = await openai.batches.retrieve(batch.id)
            return batch.status == "completed"

        await eventually(completed, within=30, interval=0.05, what="the batch to complete")

        async def record(file_id: str | None) -> dict[str, Any] | None:
            if file_id is None:
                return None
            return dict(json.loads((await openai.files.content(file_id)).text.splitlines()[0]))

        return await record(batch.output_file_id), await record(batch.error_file_id)


@pytest.mark.parametrize("response_header", [0.0, 20.0], ids=["unset", "long"])
async def test_a_slow_answer_within_the_models_timeouts_completes_as_task_and_batch_request(
    tmp_path: Path, serve_config: ServeConfig, http: aiohttp.ClientSession, response_header: float
) -> None:
    served = await serve_config(slow_config(tmp_path, response_header))

    row = await run_task(http, served)
    assert row["status"] == "completed", row["error"]
    assert row["result"]["usage"]["completion_tokens"] == TOKENS

    output, error = await run_batch(served)
    assert error is None
    assert output is not None and output["response"]["status_code"] == 200


async def test_a_short_response_header_timeout_fails_task_batch_and_http_alike(
    tmp_path: Path, serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(slow_config(tmp_path, SHORT))

    row = await run_task(http, served)
    assert row["status"] == "failed"
    assert f"no response headers within {SHORT:g}s" in row["error"]

    output, error = await run_batch(served)
    assert output is None and error is not None
    assert f"no response headers within {SHORT:g}s" in error["error"]["message"]

    async with http.post(served.at("/v1/chat/completions"), json=chat()) as resp:
        assert resp.status == 502
        assert f"no response headers within {SHORT:g}s" in (await resp.json())["error"]["message"]
