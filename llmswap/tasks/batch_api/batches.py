"""OpenAI's Batch API on the task queue: upload a JSONL of requests, get their answers back as files.

Each request of a batch becomes a `background_tasks` row of type `batch:<model>` (its `job_id` is the
batch's row in `batches`), so batches get what tasks get: rows that survive a restart (queued ones run
after it; one running when llmswap died is reported as interrupted), one batch worker per model that
serves all of that model's queued requests before the next model is loaded, tasks' priority below
interactive traffic, and the vram router's budget when it is in use. Requests of several models may share
one file (OpenAI allows one model per file): each model's requests are batched on their own.

The poll loop (`tick`, about once a second) watches unfinished batches: once none of a batch's requests is
queued or running it writes the output and error files and marks the batch completed (or cancelled). A
batch still running at its `expires_at` (the 24 h completion window) has its queued requests dropped: the
running ones finish, and it ends `expired` with the dropped ones in its error file, as OpenAI's do.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from llmswap.config.model import Config, TasksConfig
from llmswap.tasks.batch_api import store
from llmswap.tasks.batch_api.files import (
    COMPLETION_WINDOWS,
    ENDPOINTS,
    WINDOW_SECONDS,
    BatchLine,
    answered,
    jsonl,
    parse_input,
    unanswered,
)
from llmswap.tasks.queue.db import (
    CANCELLED_ERROR,
    INTERRUPTED_ERROR,
    TaskRow,
    TaskStatus,
    cancel_task,
    fail_unfinished_task,
    insert_tasks,
    job_tasks,
)
from llmswap.tasks.queue.sql import TaskDb
from llmswap.upstream import Dispatcher
from llmswap.upstream.dispatcher import Lease

log = logging.getLogger("llmswap.tasks.batch_api.batches")

PURPOSES = ("batch",)  # what may be uploaded; llmswap writes `batch_output` files itself
_MODEL_NOT_FOUND = "model_not_found"
EXPIRED_ERROR = "batch expired"  # the error of a request dropped when its batch's window ran out


class BatchRequestError(Exception):
    """A request to the Batch API that cannot be honoured: its HTTP status and OpenAI-style message."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


@dataclass(frozen=True)
class BatchView:
    """A batch with its request counts: what the API returns."""

    batch: store.StoredBatch
    counts: store.RequestCounts

    def as_openai(self) -> dict[str, Any]:
        return self.batch.as_openai(self.counts)


class BatchHost(Protocol):
    """What the Batch API needs of the task service it runs on (`llmswap.tasks.queue.service.TaskService`)."""

    db: TaskDb
    tasks: TasksConfig
    dispatcher: Dispatcher

    def model_id(self, config: Config, name: str) -> str | None: ...
    def add_batch_types(self, types: Mapping[str, str]) -> None: ...
    def enqueue_threadsafe(self, task_id: int, task_type: str, job_id: int) -> None: ...
    def discard_threadsafe(self, task_id: int) -> None: ...


class Batches:
    """The Batch API of one TaskService. Methods touching the database block: call them off the loop."""

    def __init__(self, service: BatchHost) -> None:
        self.service = service
        self.db = service.db
        # The poll loop and a cancel may both find a batch done: one of them writes its files.
        self._finishing = threading.Lock()

    # ------------------------------------------------------------------ files

    def upload(
        self, filename: str, purpose: str, content: bytes, owner: str | None = None
    ) -> store.StoredFile:
        if purpose not in PURPOSES:
            raise BatchRequestError(400, f"purpose must be one of {', '.join(PURPOSES)}, got {purpose!r}",
                                    "purpose")
        return store.add_file(self.db, filename or "upload.jsonl", purpose, content, owner)

    # ------------------------------------------------------------------ batches

    def create(
        self, config: Config, *, input_file_id: str, endpoint: str, completion_window: str, metadata: Any,
        owner: str | None = None,
    ) -> BatchView:
        if endpoint not in ENDPOINTS:
            raise BatchRequestError(400, f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}",
                                    "endpoint")
        if completion_window not in COMPLETION_WINDOWS:
            raise BatchRequestError(400, f"completion_window must be one of {', '.join(COMPLETION_WINDOWS)}, "
                                    f"got {completion_window!r}", "completion_window")
        if metadata is not None and not isinstance(metadata, dict):
            raise BatchRequestError(400, "metadata must be an object", "metadata")
        content = store.file_content(self.db, input_file_id, owner)
        if content is None:
            raise BatchRequestError(404, f"no file {input_file_id!r}: upload it first (POST /v1/files)",
                                    "input_file_id")
        lines, errors = parse_input(content, endpoint)
        expires_at = store.now_seconds() + WINDOW_SECONDS[completion_window]
        common: dict[str, Any] = dict(endpoint=endpoint, input_file_id=input_file_id,
                                      completion_window=completion_window, expires_at=expires_at,
                                      metadata=metadata, owner=owner)
        if errors:
            failed = store.add_batch(self.db, **common, total=0, status="failed",
                                     errors={"object": "list", "data": [e.as_openai() for e in errors]})
            log.warning("batch %s: the input file %s is invalid (%d error(s)); nothing runs",
                        failed.id, input_file_id, len(errors))
            return self.view(failed)
        # Under the poll's lock: a tick between the batch's row and its requests' rows would find nothing
        # pending and end the batch empty.
        with self._finishing:
            batch = store.add_batch(self.db, **common, total=len(lines), status="in_progress")
            self._queue(config, batch, endpoint, lines)
        return self.view(batch)

    def _queue(self, config: Config, batch: store.StoredBatch, endpoint: str, lines: list[BatchLine]) -> None:
        resolved = {line.model: self.service.model_id(config, line.model) for line in lines}
        known = {model for model in resolved.values() if model is not None}
        types = {f"{store.BATCH_TYPE_PREFIX}{model}": model for model in known}
        # The types first: the lanes then accept the rows, and a restart meanwhile loads them back.
        self.service.add_batch_types(types)
        rows = [
            (f"{store.BATCH_TYPE_PREFIX}{resolved[line.model] or line.model}", batch.seq,
             {"custom_id": line.custom_id, "url": endpoint, "model": line.model, "body": dict(line.body)})
            for line in lines
        ]
        ids = insert_tasks(self.db, rows)
        for task_id, line, (task_type, _, _) in zip(ids, lines, rows, strict=True):
            if resolved[line.model] is None:
                why = f"{_MODEL_NOT_FOUND}: no model or alias {line.model!r} in this config"
                fail_unfinished_task(self.db, task_id, why)
            else:
                self.service.enqueue_threadsafe(task_id, task_type, batch.seq)
        log.info("batch %s: %d request(s) queued for %s", batch.id, len(lines), sorted(set(types.values())))

    def view(self, batch: store.StoredBatch) -> BatchView:
        return BatchView(batch, store.request_counts(self.db, batch.seq, batch.total))

    def get(self, batch_id: str, owner: str | None = None) -> BatchView | None:
        batch = store.get_batch(self.db, batch_id, owner)
        return None if batch is None else self.view(batch)

    def listing(self, *, after: str | None, limit: int, owner: str | None = None) -> list[BatchView]:
        return [self.view(b) for b in store.list_batches(self.db, after=after, limit=limit, owner=owner)]

    def cancel(self, batch_id: str, owner: str | None = None) -> BatchView | None:
        """Stop a batch: its queued requests are cancelled, running ones finish, then it is `cancelled`."""
        batch = store.get_batch(self.db, batch_id, owner)
        if batch is None:
            return None
        if batch.final or batch.status == "cancelling":
            return self.view(batch)
        store.set_batch_status(self.db, batch_id, "cancelling", expect=("validating", "in_progress"))
        self._drop_queued(batch, CANCELLED_ERROR)
        self.tick()  # with nothing running it is cancelled at once
        return self.get(batch_id)

    # ------------------------------------------------------------------ finishing

    def tick(self) -> None:
        """Finish every batch whose requests are all done: write its files, set its final status."""
        with self._finishing:
            for batch in store.unfinished_batches(self.db):
                try:
                    self._finish_if_done(batch)
                except Exception:
                    log.exception("batch %s: finishing it failed; retrying on the next tick", batch.id)

    def _drop_queued(self, batch: store.StoredBatch, error: str) -> None:
        for row in job_tasks(self.db, batch.seq, store.BATCH_TYPE_PREFIX, TaskStatus.QUEUED.value):
            if cancel_task(self.db, row.id, error=error):
                self.service.discard_threadsafe(row.id)

    def _finish_if_done(self, batch: store.StoredBatch) -> None:
        expires_at = batch.times.get("expires_at")
        if batch.status == "in_progress" and expires_at is not None and store.now_seconds() >= expires_at:
            self._drop_queued(batch, EXPIRED_ERROR)
        elif batch.status == "cancelling":
            self._drop_queued(batch, CANCELLED_ERROR)  # a preempted request came back to the queue since
        if store.request_counts(self.db, batch.seq, batch.total).pending:
            return
        outputs: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        expired = False
        for row in job_tasks(self.db, batch.seq, store.BATCH_TYPE_PREFIX):
            record, ok = _record(row)
            (outputs if ok else errors).append(record)
            expired = expired or row.error == EXPIRED_ERROR
        output = store.add_file(self.db, f"{batch.id}_output.jsonl", "batch_output", jsonl(outputs),
                                batch.owner) if outputs else None
        error = store.add_file(self.db, f"{batch.id}_error.jsonl", "batch_output", jsonl(errors),
                               batch.owner) if errors else None
        final = "cancelled" if batch.status == "cancelling" else "expired" if expired else "completed"
        if not store.set_batch_status(self.db, batch.id, final, expect=(batch.status,),
                                      output_file_id=output.id if output else None,
                                      error_file_id=error.id if error else None):
            # Another host sharing the queue finished it first: its files stand, these go.
            for written in (output, error):
                if written is not None:
                    store.delete_file(self.db, written.id)
            return
        log.info("batch %s %s: %d answered, %d failed", batch.id, final, len(outputs), len(errors))

    # ------------------------------------------------------------------ running one request (event loop)

    async def run(self, row: TaskRow, lease: Lease | None = None) -> dict[str, Any]:
        """Send one request of a batch through the router (on `lease`, the grant its lane holds, if any);
        its status and body, whatever the status."""
        params: Mapping[str, Any] = row.params if isinstance(row.params, dict) else {}
        model = row.task_type[len(store.BATCH_TYPE_PREFIX):]
        body = dict(params.get("body") or {})
        if "stream" in body:
            body["stream"] = False  # a batch stores whole answers
        requested = str(params.get("model") or model)
        path = str(params.get("url") or "/v1/chat/completions")
        answer = await self.service.dispatcher.post_json(
            model, path, body, requested=requested, origin="batch", priority=self.service.tasks.priority,
            lease=lease,
        )
        status, text = answer.status, answer.text
        try:
            parsed: Any = json.loads(text)
        except ValueError:
            parsed = text
        return {"status_code": status, "body": parsed}


def _record(row: TaskRow) -> tuple[dict[str, Any], bool]:
    """A request's line for the output file (True) or the error file (False)."""
    params = row.params if isinstance(row.params, dict) else {}
    custom_id = str(params.get("custom_id", row.id))
    if row.status is TaskStatus.COMPLETED and row.result is not None:
        result = json.loads(row.result)
        status = int(result.get("status_code", 500))
        return answered(custom_id, row.id, status, result.get("body")), status < 400
    error = row.error or "failed"
    if error == CANCELLED_ERROR:
        message = "the batch was cancelled before this request ran"
        return unanswered(custom_id, row.id, "batch_cancelled", message), False
    if error == EXPIRED_ERROR:
        message = "the batch's completion window ran out before this request ran"
        return unanswered(custom_id, row.id, "batch_expired", message), False
    if error == INTERRUPTED_ERROR:
        return unanswered(custom_id, row.id, "interrupted", "llmswap stopped while this request ran"), False
    if error.startswith(f"{_MODEL_NOT_FOUND}: "):
        return unanswered(custom_id, row.id, _MODEL_NOT_FOUND, error.partition(": ")[2]), False
    return unanswered(custom_id, row.id, "request_failed", error), False
