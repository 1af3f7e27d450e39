"""OpenAI's Files and Batches routes over the task queue (`batches.py`); the official clients work as-is.

    POST /v1/files (multipart: file, purpose=batch) · GET /v1/files · GET /v1/files/{id}
    GET /v1/files/{id}/content · DELETE /v1/files/{id}
    POST /v1/batches {input_file_id, endpoint, completion_window, metadata?} · GET /v1/batches
    GET /v1/batches/{id} · POST /v1/batches/{id}/cancel

They need the `tasks:` section (its database holds files and batches); without it they answer 404 saying
so. Database work runs on a thread, never on the event loop.

With `apiKeys`, each request sees only the files and batches of its own key's name (`batch_store`); another
key's answer 404 exactly as a missing one does, so ids cannot be probed. A file name holding a control
character (CR, LF, NUL...) is refused: it could not travel in a header; Content-Disposition is built so that
no stored name can break the response either.
"""

from __future__ import annotations

import asyncio
import unicodedata
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from llmswap.server.admin.tasks import TASKS
from llmswap.server.http.errors import error_response
from llmswap.server.http.middleware import too_large_message
from llmswap.server.state import API_KEY, state
from llmswap.tasks.batch_api import store
from llmswap.tasks.batch_api.batches import BatchRequestError, BatchView
from llmswap.tasks.queue.service import TaskService

MAX_LIST = 100
MAX_FILENAME = 255  # characters, as file systems allow


def setup(app: web.Application) -> None:
    app.router.add_post("/v1/files", upload)
    app.router.add_get("/v1/files", list_files)
    app.router.add_get("/v1/files/{file_id}", show_file)
    app.router.add_get("/v1/files/{file_id}/content", file_content)
    app.router.add_delete("/v1/files/{file_id}", delete_file)
    app.router.add_post("/v1/batches", create_batch)
    app.router.add_get("/v1/batches", list_batches)
    app.router.add_get("/v1/batches/{batch_id}", show_batch)
    app.router.add_post("/v1/batches/{batch_id}/cancel", cancel_batch)


class _Refused(Exception):
    def __init__(self, response: web.Response) -> None:
        self.response = response


async def _service(request: web.Request) -> TaskService:
    """The task service, once its database is ready (`TaskService.settled`); a 404 without `tasks:`."""
    service = request.app[TASKS].enabled()
    if service is None:
        raise _Refused(error_response(
            request, 404, "the Batch API needs the task queue: add a `tasks:` section (with its `db`, which "
            "holds files and batches) to the config", force_json=True,
        ))
    await service.settled()
    return service


def _refusals(handler: Any) -> Any:
    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except _Refused as refused:
            return refused.response
        except BatchRequestError as exc:
            return error_response(request, exc.status, exc.message, param=exc.param, force_json=True)

    handle.__name__ = handler.__name__
    return handle


def _owner(request: web.Request) -> str | None:
    """Whose files and batches this request may see: its API key's name; None (everything) without keys."""
    key = request.get(API_KEY)
    return None if key is None else key.owner


def filename_problem(filename: str) -> str | None:
    """Why an uploaded file's name is refused, or None when it is fine."""
    if len(filename) > MAX_FILENAME:
        return f"the file name is {len(filename)} characters long; at most {MAX_FILENAME} are allowed"
    for ch in filename:
        if unicodedata.category(ch) == "Cc":
            return (f"the file name contains the control character {ch!a}; "
                    "rename the file without line breaks, NUL or other control characters")
    return None


def content_disposition(filename: str) -> str:
    """`attachment` naming `filename` safely whatever it holds (RFC 6266): a plain-ASCII fallback with
    anything risky replaced, and the exact name percent-encoded in `filename*`."""
    fallback = "".join(ch if " " <= ch <= "~" and ch not in '"\\' else "_" for ch in filename)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"


def _limit(request: web.Request, default: int) -> int:
    text = request.query.get("limit", str(default))
    try:
        limit = int(text)
    except ValueError:
        raise _Refused(error_response(request, 400, f"limit must be an integer, got {text!r}",
                                      force_json=True)) from None
    if not 1 <= limit <= MAX_LIST:
        raise _Refused(error_response(request, 400, f"limit must be between 1 and {MAX_LIST}, got {limit}",
                                      force_json=True))
    return limit


# ---------------------------------------------------------------------------------------------- files


@_refusals
async def upload(request: web.Request) -> web.Response:
    service = await _service(request)
    limit = state(request).config.max_request_body
    if request.content_length is not None and request.content_length > limit:
        return error_response(request, 413, too_large_message(limit), force_json=True)
    if not request.content_type.startswith("multipart/"):
        return error_response(request, 400, "upload the file as multipart/form-data with fields `file` and "
                              "`purpose`", force_json=True)
    try:
        form = await _read_form(request, limit)
    except _FormTooLarge:
        return error_response(request, 413, too_large_message(limit), force_json=True)
    except ValueError as exc:  # aiohttp's multipart reader: no boundary, a wrong one, a broken part
        return error_response(request, 400, f"the multipart/form-data body cannot be read ({exc}); upload "
                              "the file with fields `file` and `purpose`", force_json=True)
    fields, content, filename = form
    if content is None:
        return error_response(request, 400, "the form has no `file` field", force_json=True)
    problem = filename_problem(filename)
    if problem is not None:
        return error_response(request, 400, problem, param="file", force_json=True)
    stored = await asyncio.to_thread(service.batches.upload, filename, fields.get("purpose", ""), content,
                                     _owner(request))
    return web.json_response(stored.as_openai())


class _FormTooLarge(Exception):
    pass


async def _read_form(request: web.Request, limit: int) -> tuple[dict[str, str], bytes | None, str]:
    """(text fields, the `file` field's bytes, its filename), refusing more than `limit` bytes in all the
    fields together, counted as they arrive (a chunked upload has no Content-Length to check first)."""
    fields: dict[str, str] = {}
    content: bytes | None = None
    filename = ""
    total = 0
    reader = await request.multipart()
    async for part in reader:
        if not isinstance(part, aiohttp.BodyPartReader) or part.name is None:
            continue
        data = bytearray()
        while chunk := await part.read_chunk():
            data += chunk
            total += len(chunk)
            if total > limit:
                raise _FormTooLarge
        if part.name == "file":
            content, filename = bytes(data), part.filename or ""
        else:
            fields[part.name] = data.decode("utf-8", errors="replace")
    return fields, content, filename


@_refusals
async def list_files(request: web.Request) -> web.Response:
    service = await _service(request)
    limit = _limit(request, MAX_LIST)
    files = await asyncio.to_thread(store.list_files, service.db, request.query.get("purpose"), limit,
                                    _owner(request))
    return web.json_response({"object": "list", "data": [f.as_openai() for f in files], "has_more": False})


async def _file(request: web.Request, service: TaskService) -> store.StoredFile:
    file_id = request.match_info["file_id"]
    stored = await asyncio.to_thread(store.get_file, service.db, file_id, _owner(request))
    if stored is None:
        raise _Refused(error_response(request, 404, f"no file {file_id!r}", force_json=True))
    return stored


@_refusals
async def show_file(request: web.Request) -> web.Response:
    service = await _service(request)
    return web.json_response((await _file(request, service)).as_openai())


@_refusals
async def file_content(request: web.Request) -> web.Response:
    service = await _service(request)
    stored = await _file(request, service)
    content = await asyncio.to_thread(store.file_content, service.db, stored.id, _owner(request))
    return web.Response(body=content or b"", content_type="application/octet-stream",
                        headers={"Content-Disposition": content_disposition(stored.filename)})


@_refusals
async def delete_file(request: web.Request) -> web.Response:
    service = await _service(request)
    stored = await _file(request, service)
    await asyncio.to_thread(store.delete_file, service.db, stored.id, _owner(request))
    return web.json_response({"id": stored.id, "object": "file", "deleted": True})


# ---------------------------------------------------------------------------------------------- batches


@_refusals
async def create_batch(request: web.Request) -> web.Response:
    service = await _service(request)
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deeply
        return error_response(request, 400, "body must be JSON: {\"input_file_id\", \"endpoint\", "
                              "\"completion_window\"}", force_json=True)
    if not isinstance(body, dict):
        return error_response(request, 400, "body must be a JSON object", force_json=True)
    for field in ("input_file_id", "endpoint", "completion_window"):
        if not isinstance(body.get(field), str):
            return error_response(request, 400, f"{field} is required (a string)", force_json=True)
    view = await asyncio.to_thread(
        service.batches.create, state(request).config, input_file_id=body["input_file_id"],
        endpoint=body["endpoint"], completion_window=body["completion_window"], metadata=body.get("metadata"),
        owner=_owner(request),
    )
    return web.json_response(view.as_openai())


@_refusals
async def list_batches(request: web.Request) -> web.Response:
    service = await _service(request)
    limit = _limit(request, 20)
    # One more than asked for tells whether there is a next page.
    after = request.query.get("after")
    views = await asyncio.to_thread(service.batches.listing, after=after, limit=limit + 1,
                                    owner=_owner(request))
    page = views[:limit]
    return web.json_response({
        "object": "list", "data": [v.as_openai() for v in page],
        "first_id": page[0].batch.id if page else None, "last_id": page[-1].batch.id if page else None,
        "has_more": len(views) > limit,
    })


@_refusals
async def show_batch(request: web.Request) -> web.Response:
    service = await _service(request)
    return await _one_batch(request, service.batches.get)


@_refusals
async def cancel_batch(request: web.Request) -> web.Response:
    service = await _service(request)
    return await _one_batch(request, service.batches.cancel)


async def _one_batch(
    request: web.Request, action: Callable[[str, str | None], BatchView | None]
) -> web.Response:
    """Run `action` on the batch the path names, as this request's key (off the loop); the batch, or 404."""
    batch_id = request.match_info["batch_id"]
    view = await asyncio.to_thread(action, batch_id, _owner(request))
    if view is None:
        return error_response(request, 404, f"no batch {batch_id!r}", force_json=True)
    return web.json_response(view.as_openai())
