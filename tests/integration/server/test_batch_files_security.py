"""The Files and Batches API facing hostile input and several API keys, over real HTTP: names that could
break a response header are refused, any stored name downloads safely, and each key sees only its own files
and batches (another key's are 404, as if they did not exist)."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import aiohttp
import pytest
from openai import NotFoundError

from llmswap.config.model import ApiKey
from llmswap.server.admin.batches import content_disposition
from llmswap.tasks.batch_api import store
from tests.integration.server.conftest import OpenAiFor, ServeConfig
from tests.integration.server.test_batches import batch_config, finished, records, request_line

BOUNDARY = "llmswapboundary"
KEYS = (ApiKey("sk-alice", name="alice"), ApiKey("sk-bob", name="bob"))


def raw_upload(disposition: str, content: bytes = b"{}\n") -> bytes:
    """A multipart body written by hand: clients escape odd file names, an attacker does not."""
    return (
        f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
        f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; {disposition}\r\n"
        "Content-Type: application/jsonl\r\n\r\n"
    ).encode() + content + f"\r\n--{BOUNDARY}--\r\n".encode()


@pytest.mark.parametrize("disposition, shown", [
    ("filename*=UTF-8''evil%0D%0AX-Injected%3A%201.jsonl", "\\r"),
    ("filename*=UTF-8''nul%00byte.jsonl", "\\x00"),
    ("filename*=UTF-8''tab%09and%7Fdel.jsonl", "\\t"),
])
async def test_a_file_name_with_control_characters_is_refused_naming_the_param(
    tmp_path: Path, serve_config: ServeConfig, http: aiohttp.ClientSession, disposition: str, shown: str,
) -> None:
    served = await serve_config(batch_config(tmp_path))
    async with http.post(served.at("/v1/files"), data=raw_upload(disposition),
                         headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}) as response:
        assert response.status == 400
        error = (await response.json())["error"]
        assert error["param"] == "file" and shown in error["message"]
    assert store.list_files(served.config.tasks.db) == []  # type: ignore[union-attr]


async def test_any_stored_file_name_downloads_with_a_safe_content_disposition(
    tmp_path: Path, serve_config: ServeConfig, http: aiohttp.ClientSession, openai_for: OpenAiFor
) -> None:
    served = await serve_config(batch_config(tmp_path))
    db = served.config.tasks.db  # type: ignore[union-attr]
    # A row written before names were checked: its download must still answer, whole.
    stored = store.add_file(db, 'old"\r\nSet-Cookie: x=1\x00é.jsonl', "batch", b"line\n")
    async with http.get(served.at(f"/v1/files/{stored.id}/content")) as response:
        assert response.status == 200 and await response.read() == b"line\n"
        assert "Set-Cookie" not in response.headers
        disposition = response.headers["Content-Disposition"]
    assert disposition == content_disposition(stored.filename)
    assert disposition.startswith('attachment; filename="old___Set-Cookie: x=1__.jsonl"; ')
    assert disposition.endswith("filename*=UTF-8''old%22%0D%0ASet-Cookie%3A%20x%3D1%00%C3%A9.jsonl")

    unicode_name = await openai_for(served, "unused").files.create(file=("résumé \"q\".jsonl", b"{}\n"),
                                                                   purpose="batch")
    async with http.get(served.at(f"/v1/files/{unicode_name.id}/content")) as response:
        assert response.status == 200
        assert response.content_disposition is not None
        assert response.content_disposition.filename == unicode_name.filename


async def test_each_api_key_sees_only_its_own_files_and_batches(
    tmp_path: Path, serve_config: ServeConfig, openai_for: OpenAiFor
) -> None:
    served = await serve_config(dataclasses.replace(batch_config(tmp_path), api_keys=KEYS))
    alice, bob = openai_for(served, "sk-alice"), openai_for(served, "sk-bob")
    mine = await alice.files.create(file=("a.jsonl", (request_line("one", "a") + "\n").encode()),
                                    purpose="batch")
    batch = await alice.batches.create(input_file_id=mine.id, endpoint="/v1/chat/completions",
                                       completion_window="24h")
    done = await finished(alice, batch.id)
    assert list(await records(alice, done.output_file_id)) == ["one"]

    assert [f.id async for f in bob.files.list()] == []
    assert [b.id async for b in bob.batches.list()] == []
    for file_id in (mine.id, done.output_file_id):
        assert file_id is not None
        for attempt in (bob.files.retrieve(file_id), bob.files.content(file_id), bob.files.delete(file_id)):
            with pytest.raises(NotFoundError):
                await attempt
    for attempt in (bob.batches.retrieve(batch.id), bob.batches.cancel(batch.id)):
        with pytest.raises(NotFoundError):
            await attempt
    with pytest.raises(NotFoundError):  # nor can Bob run Alice's file as his own batch
        await bob.batches.create(input_file_id=mine.id, endpoint="/v1/chat/completions",
                                 completion_window="24h")

    # Alice still has all of it: Bob's attempts changed nothing.
    assert {f.id async for f in alice.files.list()} == {mine.id, done.output_file_id}
    assert [b.id async for b in alice.batches.list()] == [batch.id]
    assert (await alice.files.delete(mine.id)).deleted


async def test_files_made_before_owners_existed_stay_readable_after_the_migration(
    tmp_path: Path, serve_config: ServeConfig, openai_for: OpenAiFor
) -> None:
    config = dataclasses.replace(batch_config(tmp_path), api_keys=KEYS)
    db = config.tasks.db  # type: ignore[union-attr]
    with sqlite3.connect(db) as conn:  # the tables as they were before files had owners
        conn.execute("CREATE TABLE batch_files (id TEXT PRIMARY KEY, filename TEXT NOT NULL, purpose TEXT"
                     " NOT NULL, bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, content BLOB NOT NULL)")
        conn.execute("INSERT INTO batch_files VALUES ('file-old', 'old.jsonl', 'batch', 3, 1, x'7b7d0a')")
    conn.close()
    served = await serve_config(config)
    for key in ("sk-alice", "sk-bob"):
        client = openai_for(served, key)
        assert (await client.files.retrieve("file-old")).filename == "old.jsonl"
        assert (await client.files.content("file-old")).content == b"{}\n"
    fresh = await openai_for(served, "sk-alice").files.create(file=("new.jsonl", b"{}\n"), purpose="batch")
    assert store.get_file(db, fresh.id) == store.StoredFile(fresh.id, "new.jsonl", "batch", 3,
                                                            fresh.created_at, "alice")


def test_a_key_without_a_name_owns_its_files_by_a_digest_never_the_key() -> None:
    key = ApiKey("sk-secret-value")
    assert key.owner.startswith("key-") and "sk-secret-value" not in key.owner
    assert key.owner == ApiKey("sk-secret-value", priority=3).owner != ApiKey("sk-other").owner
    assert ApiKey("sk-a", name="team").owner == ApiKey("sk-b", name="team").owner == "team"
