"""The Batch API's pure parts (input parsing, output records) and its tables, on a real SQLite file."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

import llmswap.tasks.batch_api.batches as batches_module
from llmswap.config.model import Config, ModelConfig, TasksConfig
from llmswap.tasks.batch_api import store
from llmswap.tasks.batch_api.batches import EXPIRED_ERROR, Batches, _record
from llmswap.tasks.batch_api.files import answered, jsonl, parse_input, unanswered
from llmswap.tasks.queue.db import (
    CANCELLED_ERROR,
    INTERRUPTED_ERROR,
    TaskStatus,
    claim_task,
    fail_unfinished_task,
    finish_task,
    init_db,
    insert_tasks,
    job_tasks,
)
from llmswap.tasks.queue.preemption import requeue_preempted

CHAT = "/v1/chat/completions"


def line(custom_id: object, model: object = "m", url: str = CHAT, method: str = "POST") -> str:
    return json.dumps({"custom_id": custom_id, "method": method, "url": url,
                       "body": {"model": model, "messages": []}})


def test_parse_input_reads_every_request_in_order() -> None:
    content = f"{line('a')}\n\n{line('b', 'other')}\n".encode()
    lines, errors = parse_input(content, CHAT)
    assert errors == []
    assert [(x.line, x.custom_id, x.model) for x in lines] == [(1, "a", "m"), (3, "b", "other")]


@pytest.mark.parametrize(
    ("text", "code", "param"),
    [
        ("{oops", "invalid_json_line", None),
        ("[1, 2]", "invalid_request", None),
        (line(""), "missing_required_parameter", "custom_id"),
        (line("x", method="GET"), "invalid_method", "method"),
        (line("x", url="/v1/embeddings"), "mismatched_endpoint", "url"),
        (json.dumps({"custom_id": "x", "url": CHAT, "body": "text"}), "invalid_request", "body"),
        (line("x", model=None), "missing_required_parameter", "body.model"),
    ],
)
def test_parse_input_names_what_is_wrong_with_a_line(text: str, code: str, param: str | None) -> None:
    lines, errors = parse_input(text.encode(), CHAT)
    assert lines == []
    assert [(e.line, e.code, e.param) for e in errors] == [(1, code, param)]


def test_parse_input_refuses_duplicates_empty_files_and_non_utf8() -> None:
    _, errors = parse_input(f"{line('a')}\n{line('a')}\n".encode(), CHAT)
    assert [(e.line, e.code) for e in errors] == [(2, "duplicate_custom_id")]
    assert [e.code for e in parse_input(b"\n \n", CHAT)[1]] == ["empty_file"]
    assert [e.code for e in parse_input(b"\xff\xfe", CHAT)[1]] == ["invalid_file"]


def test_output_records_have_openais_shape() -> None:
    ok = answered("a", 7, 200, {"x": 1})
    assert ok == {"id": "batch_req_7", "custom_id": "a", "error": None,
                  "response": {"status_code": 200, "request_id": "req_7", "body": {"x": 1}}}
    lost = unanswered("b", 8, "batch_cancelled", "gone")
    assert lost["response"] is None and lost["error"] == {"code": "batch_cancelled", "message": "gone"}
    assert jsonl([ok, lost]).decode().splitlines() == [json.dumps(ok, separators=(",", ":")),
                                                       json.dumps(lost, separators=(",", ":"))]


def test_request_counts_and_records_follow_each_rows_outcome(db: Path) -> None:
    store.init_batch_tables(db)
    batch = store.add_batch(db, endpoint=CHAT, input_file_id="file-x", completion_window="24h",
                            expires_at=0, metadata=None, total=6, status="in_progress")
    params = [{"custom_id": f"r{i}", "url": CHAT, "model": "m", "body": {}} for i in range(6)]
    ids = insert_tasks(db, [("batch:m", batch.seq, p) for p in params])
    insert_tasks(db, [("letters", batch.seq, None)])  # another type with the same job id is not the batch's
    outcomes = [({"status_code": 200, "body": {}}, None), ({"status_code": 429, "body": "busy"}, None),
                (None, CANCELLED_ERROR), (None, INTERRUPTED_ERROR), (None, "model_not_found: no model 'q'"),
                (None, EXPIRED_ERROR)]
    for task_id, (result, error) in zip(ids, outcomes, strict=False):
        if result is not None:
            claim_task(db, task_id)
            finish_task(db, task_id, TaskStatus.COMPLETED, result=json.dumps(result))
        else:
            fail_unfinished_task(db, task_id, error)
    counts = store.request_counts(db, batch.seq, 6)
    assert (counts.completed, counts.failed, counts.pending) == (1, 5, 0)  # the 429 counts as failed
    assert counts.as_openai() == {"total": 6, "completed": 1, "failed": 5}

    rows = job_tasks(db, batch.seq, store.BATCH_TYPE_PREFIX)
    assert [r.id for r in rows] == ids
    made = [_record(r) for r in rows]
    assert [ok for _, ok in made] == [True, False, False, False, False, False]
    assert made[1][0]["response"]["status_code"] == 429
    assert [r["error"]["code"] for r, _ in made[2:]] == [
        "batch_cancelled", "interrupted", "model_not_found", "batch_expired"]
    assert made[4][0]["error"]["message"] == "no model 'q'"
    assert store.batch_types_queued(db) == set()
    insert_tasks(db, [("batch:n", batch.seq, None)])
    assert store.batch_types_queued(db) == {"batch:n"}


def test_batch_status_moves_only_from_the_expected_ones(db: Path) -> None:
    store.init_batch_tables(db)
    batch = store.add_batch(db, endpoint=CHAT, input_file_id="file-x", completion_window="24h",
                            expires_at=0, metadata={"k": "v"}, total=1, status="in_progress")
    assert not store.set_batch_status(db, batch.id, "completed", expect=("cancelling",))
    assert store.set_batch_status(db, batch.id, "cancelling", expect=("in_progress",))
    assert store.set_batch_status(db, batch.id, "cancelled", expect=("cancelling",), error_file_id="file-e")
    stored = store.get_batch(db, batch.id)
    assert stored is not None and stored.final and stored.error_file_id == "file-e"
    assert stored.times["cancelling_at"] is not None and stored.times["cancelled_at"] is not None
    assert stored.metadata == {"k": "v"}
    assert store.unfinished_batches(db) == []


def test_files_keep_their_bytes(db: Path) -> None:
    store.init_batch_tables(db)
    kept = store.add_file(db, "in.jsonl", "batch", b"\x00binary\n")
    assert store.file_content(db, kept.id) == b"\x00binary\n"
    assert store.get_file(db, kept.id) == kept and kept.as_openai()["bytes"] == 8
    assert [f.id for f in store.list_files(db, "batch")] == [kept.id]
    assert store.delete_file(db, kept.id) and store.file_content(db, kept.id) is None


class _Host:
    """The little a Batches needs of its task service here: the database and where rows go."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.tasks = TasksConfig(db=db, types={})
        self.dispatcher = None
        self.queued: list[int] = []

    def model_id(self, config: Config, name: str) -> str | None:
        return config.real_model_name(name)

    def add_batch_types(self, types: object) -> None:
        pass

    def enqueue_threadsafe(self, task_id: int, task_type: str, job_id: int) -> None:
        self.queued.append(task_id)

    def discard_threadsafe(self, task_id: int) -> None:
        pass


def test_a_poll_while_a_batch_is_being_created_does_not_end_it_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "tasks.sqlite"
    init_db(db)
    store.init_batch_tables(db)
    batches = Batches(_Host(db))  # type: ignore[arg-type]
    uploaded = batches.upload("in.jsonl", "batch", f"{line('one')}\n".encode())
    config = Config(models={"m": ModelConfig(id="m", cmd=("true",), proxy="http://127.0.0.1:1")})
    polls: list[threading.Thread] = []

    def insert_after_a_poll(db_path: Path, rows: list[tuple[str, int, object]]) -> list[int]:
        # The poll runs at the worst instant: the batch's row exists, its requests' rows do not yet.
        poll = threading.Thread(target=batches.tick)
        poll.start()
        poll.join(0.2)
        polls.append(poll)
        return insert_tasks(db_path, rows)

    monkeypatch.setattr(batches_module, "insert_tasks", insert_after_a_poll)
    view = batches.create(config, input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h",
                          metadata=None)
    polls[0].join(5)
    assert not polls[0].is_alive()
    after = batches.get(view.batch.id)
    assert after is not None and after.batch.status == "in_progress"
    assert after.counts.pending == 1


def test_a_request_preempted_while_its_batch_is_cancelling_is_cancelled_not_run(tmp_path: Path) -> None:
    db = tmp_path / "tasks.sqlite"
    init_db(db)
    store.init_batch_tables(db)
    batches = Batches(_Host(db))  # type: ignore[arg-type]
    uploaded = batches.upload("in.jsonl", "batch", f"{line('one')}\n{line('two')}\n".encode())
    config = Config(models={"m": ModelConfig(id="m", cmd=("true",), proxy="http://127.0.0.1:1")})
    view = batches.create(config, input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h",
                          metadata=None)
    running, queued = (row.id for row in job_tasks(db, view.batch.seq, store.BATCH_TYPE_PREFIX))
    claim_task(db, running)
    assert batches.cancel(view.batch.id) is not None  # the queued one is cancelled; the running one goes on
    outcome = requeue_preempted(db, running, max_preemptions=3)  # ...until it is preempted
    assert outcome is not None and outcome.requeued

    batches.tick()

    after = batches.get(view.batch.id)
    assert after is not None and after.batch.status == "cancelled"
    assert (after.counts.completed, after.counts.failed, after.counts.pending) == (0, 2, 0)
    rows = job_tasks(db, view.batch.seq, store.BATCH_TYPE_PREFIX)
    assert [(r.id, r.error) for r in rows] == [(running, CANCELLED_ERROR), (queued, CANCELLED_ERROR)]
