"""Bad and hostile request bodies get a 4xx in OpenAI's envelope, never a 5xx: JSON nested too deep, broken
multipart, task ids beyond 64 bits, compressed bodies (forwarded decoded; an invalid one refused), and the
body limit across multipart fields and chunked bodies without a Content-Length."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmswap.config.model import Config, TasksConfig
from tests.helpers.models import demo_config, exclusive_config
from tests.integration.server.conftest import ServeConfig, Served

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
DEEP = b"[" * 100_000 + b"]" * 100_000  # json.loads raises RecursionError on it


def tasks_config(tmp_path: Path, **overrides: Any) -> Config:
    return exclusive_config(demo_config("m"), tasks=TasksConfig(db=tmp_path / "tasks.sqlite"), **overrides)


async def error_of(response: aiohttp.ClientResponse) -> dict[str, Any]:
    payload = await response.json(content_type=None)
    assert set(payload) == {"error"}, payload
    error = payload["error"]
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
    return error


async def refused(http: aiohttp.ClientSession, served: Served, path: str, status: int, **kwargs: Any) -> str:
    """POST to `path`, assert the answer is `status` in the envelope; its message."""
    async with http.post(served.at(path), **kwargs) as response:
        error = await error_of(response)
        assert response.status == status, (path, error)
        return str(error["message"])


async def test_json_nested_too_deep_is_400_on_every_json_route(
    serve_config: ServeConfig, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    served = await serve_config(tasks_config(tmp_path))
    headers = {"Content-Type": "application/json"}
    for path in ("/v1/chat/completions", "/v1/messages", "/api/tasks", "/v1/batches"):
        message = await refused(http, served, path, 400, data=DEEP, headers=headers)
        assert "nested" in message or "JSON" in message, (path, message)


async def test_multipart_without_or_with_a_wrong_boundary_is_400_on_files(
    serve_config: ServeConfig, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    served = await serve_config(tasks_config(tmp_path))
    form = b'--real\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--real--\r\n'
    for content_type in ("multipart/form-data", "multipart/form-data; boundary=other"):
        headers = {"Content-Type": content_type}
        message = await refused(http, served, "/v1/files", 400, data=form, headers=headers)
        assert "multipart" in message, message


async def test_a_task_id_beyond_64_bits_is_404(
    serve_config: ServeConfig, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    served = await serve_config(tasks_config(tmp_path))
    for method in ("GET", "DELETE"):
        async with http.request(method, served.at("/api/tasks/99999999999999999999999")) as response:
            assert response.status == 404
            assert "no task 99999999999999999999999" in (await error_of(response))["message"]


async def test_a_compressed_request_body_reaches_the_upstream_decoded(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    raw = json.dumps(CHAT).encode()
    for encoding, body in (("gzip", gzip.compress(raw)), ("deflate", zlib.compress(raw))):
        headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
        async with http.post(served.at("/v1/chat/completions"), data=body, headers=headers) as response:
            assert response.status == 200, (encoding, await response.text())
            answer = await response.json()
            assert answer["model"] == "m" and answer["choices"], answer


async def test_an_invalid_compressed_body_is_400(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    path = "/v1/chat/completions"
    message = await refused(http, served, path, 400, data=b"not gzip at all", headers=headers)
    assert "gzip" in message or "decod" in message or "compress" in message, message


async def test_the_upload_limit_counts_every_multipart_field_together(
    serve_config: ServeConfig, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    served = await serve_config(tasks_config(tmp_path, max_request_body=64 * 1024))
    boundary = "b0undary"
    fields = [(f"extra{index}", b"x" * 20_000) for index in range(4)]  # each under the limit, together over
    form = b"".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode() + value + b"\r\n"
        for name, value in [*fields, ("purpose", b"batch")]
    ) + (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="r.jsonl"\r\n\r\n'
         f"{{}}\n\r\n--{boundary}--\r\n").encode()

    async def sent_chunked() -> AsyncIterator[bytes]:  # no Content-Length to refuse it by
        for start in range(0, len(form), 4096):
            yield form[start:start + 4096]

    message = await refused(http, served, "/v1/files", 413, data=sent_chunked(),
                            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert "maxRequestBodySize" in message


async def chunked(size: int, head: bytes = b"", tail: bytes = b"") -> AsyncIterator[bytes]:
    """A body sent chunked (no Content-Length) of about `size` bytes."""
    yield head
    for _ in range(size // 1024):
        yield b"y" * 1024
    yield tail


async def test_chunked_bodies_over_the_limit_are_413_on_every_body_route(
    serve_config: ServeConfig, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    served = await serve_config(tasks_config(tmp_path, max_request_body=16 * 1024))
    json_headers = {"Content-Type": "application/json"}
    for path in ("/api/tasks", "/v1/batches", "/v1/chat/completions", "/upstream/m/v1/chat/completions"):
        body = chunked(64 * 1024, b'{"x": "', b'"}')
        await refused(http, served, path, 413, data=body, headers=json_headers)
    boundary = "b0undary"
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="f.jsonl"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    upload = chunked(64 * 1024, head, f"\r\n--{boundary}--\r\n".encode())
    await refused(http, served, "/v1/files", 413, data=upload,
                  headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})


@pytest.mark.slow_callbacks("aiohttp inflates a compressed body ahead of its reader: about 16 MiB of "
                            "this bomb in one step (0.15 s here) before the limit refuses it")
async def test_the_body_limit_counts_decoded_bytes_so_a_gzip_bomb_is_413(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m"), max_request_body=1024 * 1024))
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip container
    zeros = b"\0" * (1024 * 1024)
    bomb = b"".join(packer.compress(zeros) for _ in range(64)) + packer.flush()  # 64 MiB in ~64 KiB
    assert len(bomb) < 1024 * 1024
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    message = await refused(http, served, "/v1/chat/completions", 413, data=bomb, headers=headers)
    assert "maxRequestBodySize" in message
