"""OpenAI's Batch API over the task queue, driven by the official `openai` client against real demo upstreams:
requests batched model by model, answers in output and error files, invalid files, cancel, and a restart."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
from openai import AsyncOpenAI, NotFoundError

from llmswap.config.model import Config, GroupConfig, RouterConfig, RoutingConfig, TasksConfig
from tests.helpers.models import demo_config
from tests.helpers.wait import eventually
from tests.integration.server.conftest import OpenAiFor, ServeConfig, serving


def batch_config(tmp_path: Path, *flags: str) -> Config:
    models = {m: demo_config(m, *flags, aliases=(f"{m}-alias",)) for m in ("a", "b")}
    groups = {"(default)": GroupConfig("(default)", members=("a", "b"))}  # one model at a time
    return Config(
        models=models, aliases={"a-alias": "a", "b-alias": "b"},
        routing=RoutingConfig(router=RouterConfig(use="group", groups=groups)),
        tasks=TasksConfig(db=tmp_path / "tasks.sqlite"),
    )


def request_line(custom_id: str, model: str, text: str = "hi", url: str = "/v1/chat/completions") -> str:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 3}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


async def upload(openai: AsyncOpenAI, *lines: str) -> str:
    created = await openai.files.create(file=("requests.jsonl", ("\n".join(lines) + "\n").encode()),
                                        purpose="batch")
    assert created.purpose == "batch" and created.bytes > 0
    return created.id


async def finished(openai: AsyncOpenAI, batch_id: str, status: str = "completed") -> Any:
    batch = None

    async def done() -> bool:
        nonlocal batch
        batch = await openai.batches.retrieve(batch_id)
        return batch.status == status

    await eventually(done, within=30, interval=0.1, what=f"batch {batch_id} {status}")
    return batch


async def records(openai: AsyncOpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    if file_id is None:
        return {}
    content = await openai.files.content(file_id)
    return {r["custom_id"]: r for r in map(json.loads, content.text.splitlines())}


def answer_of(record: dict[str, Any]) -> str:
    return str(record["response"]["body"]["choices"][0]["message"]["content"])


async def test_a_batch_runs_model_by_model_and_returns_its_answers_as_files(
    tmp_path: Path, serve_config: ServeConfig, openai_for: OpenAiFor
) -> None:
    served = await serve_config(batch_config(tmp_path))
    loads: Counter[str] = Counter()
    served.router.add_observer(
        lambda e: loads.update([e.model]) if getattr(e, "kind", "") == "starting" else None
    )
    openai = openai_for(served)
    # Interleaved models: FIFO would swap at every line; the batch loads each model once.
    lines = [request_line(f"req-{i}", "a" if i % 2 == 0 else "b-alias", f"question {i}") for i in range(6)]
    file_id = await upload(openai, *lines, request_line("lost", "ghost"))
    batch = await openai.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                        completion_window="24h", metadata={"run": "nightly"})
    assert batch.status == "in_progress" and batch.metadata == {"run": "nightly"}
    batch = await finished(openai, batch.id)

    counts = batch.request_counts
    assert counts is not None and (counts.total, counts.completed, counts.failed) == (7, 6, 1)
    assert loads == {"a": 1, "b": 1}
    outputs = await records(openai, batch.output_file_id)
    assert sorted(outputs) == [f"req-{i}" for i in range(6)]
    for i in range(6):
        record = outputs[f"req-{i}"]
        assert record["response"]["status_code"] == 200 and record["error"] is None
        assert answer_of(record).startswith(f"demo {'a' if i % 2 == 0 else 'b'} says")
    errors = await records(openai, batch.error_file_id)
    assert list(errors) == ["lost"]
    assert errors["lost"]["error"]["code"] == "model_not_found"
    assert "'ghost'" in errors["lost"]["error"]["message"]

    listed = await openai.batches.list()
    assert [b.id for b in listed.data] == [batch.id]
    output_files = [f async for f in openai.files.list(purpose="batch_output")]
    assert {f.id for f in output_files} == {batch.output_file_id, batch.error_file_id}


async def test_an_invalid_input_file_fails_the_batch_naming_each_line(
    tmp_path: Path, serve_config: ServeConfig, openai_for: OpenAiFor
) -> None:
    served = await serve_config(batch_config(tmp_path))
    openai = openai_for(served)
    file_id = await upload(
        openai, request_line("one", "a"), "{not json", request_line("one", "a"),
        request_line("two", "a", url="/v1/embeddings"),
    )
    batch = await openai.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
    assert batch.status == "failed" and batch.errors is not None
    codes = [(e.line, e.code) for e in batch.errors.data or []]
    assert codes == [(2, "invalid_json_line"), (3, "duplicate_custom_id"), (4, "mismatched_endpoint")]
    assert served.router.processes["a"].pid is None  # nothing ran

    try:
        await openai.batches.create(input_file_id="file-missing", endpoint="/v1/chat/completions",
                                    completion_window="24h")
        raise AssertionError("a batch of a missing file was accepted")
    except NotFoundError as exc:
        assert "file-missing" in str(exc)
    deleted = await openai.files.delete(file_id)
    assert deleted.deleted
    try:
        await openai.files.retrieve(file_id)
        raise AssertionError("a deleted file is still there")
    except NotFoundError:
        pass


async def test_cancelling_a_batch_stops_its_queued_requests(
    tmp_path: Path, serve_config: ServeConfig, openai_for: OpenAiFor
) -> None:
    served = await serve_config(batch_config(tmp_path, "--tokens-per-second", "10"))
    openai = openai_for(served)
    file_id = await upload(openai, *(request_line(f"req-{i}", "a") for i in range(5)))
    batch = await openai.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
    cancelled = await openai.batches.cancel(batch.id)
    assert cancelled.status in ("cancelling", "cancelled")
    batch = await finished(openai, batch.id, "cancelled")
    assert batch.request_counts is not None
    assert batch.request_counts.completed + batch.request_counts.failed == 5
    assert batch.request_counts.failed >= 4  # at most the one already running was answered
    errors = await records(openai, batch.error_file_id)
    assert {r["error"]["code"] for r in errors.values()} == {"batch_cancelled"}


async def test_a_batch_past_its_window_expires_with_what_it_did_not_run(
    tmp_path: Path, serve_config: ServeConfig, openai_for: OpenAiFor
) -> None:
    config = batch_config(tmp_path, "--tokens-per-second", "10")
    served = await serve_config(config)
    openai = openai_for(served)
    file_id = await upload(openai, *(request_line(f"req-{i}", "a") for i in range(5)))
    batch = await openai.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
    assert batch.expires_at is not None and batch.expires_at - batch.created_at == 24 * 3600
    # A day passes, as far as the batch knows.
    assert config.tasks is not None
    with sqlite3.connect(config.tasks.db) as db:
        db.execute("UPDATE batches SET expires_at = 0 WHERE id = ?", (batch.id,))
    batch = await finished(openai, batch.id, "expired")
    assert batch.expired_at is not None and batch.request_counts is not None
    assert batch.request_counts.completed + batch.request_counts.failed == 5
    errors = await records(openai, batch.error_file_id)
    assert errors and {r["error"]["code"] for r in errors.values()} == {"batch_expired"}
    outputs = await records(openai, batch.output_file_id)
    assert sorted([*outputs, *errors]) == [f"req-{i}" for i in range(5)]


async def test_a_batch_carries_on_after_a_restart(tmp_path: Path, openai_for: OpenAiFor) -> None:
    config = batch_config(tmp_path, "--tokens-per-second", "20")
    async with serving(config) as first:
        openai = openai_for(first)
        file_id = await upload(openai, *(request_line(f"req-{i}", "a") for i in range(4)))
        batch = await openai.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                            completion_window="24h")

        async def one_answered() -> bool:
            counts = (await openai.batches.retrieve(batch.id)).request_counts
            return counts is not None and counts.completed >= 1

        await eventually(one_answered, within=30, what="a first answer")
    # The server stopped mid-batch; the next one on the same database finishes it.
    async with serving(config) as second:
        openai = openai_for(second)
        done = await finished(openai, batch.id)
        assert done.request_counts is not None
        assert done.request_counts.total == 4
        assert done.request_counts.completed >= 3  # at most the one cut by the stop failed
        outputs = await records(openai, done.output_file_id)
        errors = await records(openai, done.error_file_id)
        assert sorted([*outputs, *errors]) == [f"req-{i}" for i in range(4)]


async def test_without_a_tasks_section_the_batch_api_says_what_it_needs(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(Config(models={"a": demo_config("a")}))
    async with http.get(served.at("/v1/batches")) as response:
        assert response.status == 404
        assert "`tasks:` section" in (await response.json())["error"]["message"]
