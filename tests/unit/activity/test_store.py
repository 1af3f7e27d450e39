"""The SQLite activity store: rows survive reopening, queries and stats answer as the in-memory log does,
retention bounds it, and a file that is not a database is reported instead of stopping anything."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path

import pytest

from llmswap.activity.query import ActivityQuery, parse_query
from llmswap.activity.record import ActivityRecord
from llmswap.activity.store import SqliteLog, open_store
from llmswap.activity.tokens import TokenStats


def record(activity_id: int, model: str = "m1", speed: float = 10.0) -> ActivityRecord:
    tokens = TokenStats(cache_tokens=1, input_tokens=2, output_tokens=3, prompt_per_second=speed,
                        tokens_per_second=speed * 2, draft_tokens=-1, draft_acc_tokens=-1)
    return ActivityRecord(id=activity_id, timestamp=1_700_000_000.5 + activity_id, model=model,
                          req_path="/v1/chat/completions", resp_status_code=200, tokens=tokens,
                          duration_ms=12, metadata={"selector": "s"}, origin="task", key_name="apiKeys[0]",
                          queue_ms=4, load_ms=None, ttfb_ms=7, started=1_700_000_000.0)


async def add_all(store: SqliteLog, records: list[ActivityRecord]) -> list[int]:
    stored: list[int] = []
    done = asyncio.Event()

    def on_stored(row: ActivityRecord) -> None:
        stored.append(row.id)
        if len(stored) == len(records):
            done.set()

    for each in records:
        store.add(each, on_stored)
    await asyncio.wait_for(done.wait(), 10)
    return stored


async def test_rows_survive_reopening_and_read_back_whole(tmp_path: Path) -> None:
    path = tmp_path / "activity.db"
    store = await open_store(path, 0)
    assert store is not None and store.next_id == 1
    await add_all(store, [record(1), record(2, "m2"), record(3)])
    await store.close()

    again = await open_store(path, 0)
    assert again is not None and again.next_id == 4
    page = await again.page(ActivityQuery())
    assert [row.id for row in page.rows] == [3, 2, 1] and page.rows[-1] == record(1)
    picked = await again.page(parse_query({"model": ["m1"], "sort": ["id"], "order": ["asc"]}))
    assert [row.id for row in picked.rows] == [1, 3] and picked.total == 2
    stats = await again.stats("m1")
    assert (stats["total_requests"], stats["total_input_tokens"], stats["total_cache_tokens"]) == (2, 4, 2)
    await again.close()


async def test_retention_keeps_the_newest_rows(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "a.db", 5)
    assert store is not None
    await add_all(store, [record(i) for i in range(1, 21)])
    page = await store.page(ActivityQuery(limit=100))
    assert [row.id for row in page.rows] == [20, 19, 18, 17, 16]
    await store.close()


async def test_a_file_that_is_not_a_database_is_reported_and_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "corrupt.db"
    path.write_bytes(b"this is not sqlite at all" * 100)
    with caplog.at_level(logging.WARNING, logger="llmswap.activity"):
        assert await open_store(path, 0) is None
    assert "cannot be used" in caplog.text and str(path) in caplog.text


async def test_a_failing_write_is_logged_once_and_the_store_keeps_going(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "a.db"
    store = await open_store(path, 0)
    assert store is not None
    with sqlite3.connect(path) as other:
        other.execute("DROP TABLE activity")  # writes fail from now on
    with caplog.at_level(logging.WARNING, logger="llmswap.activity"):
        store.add(record(1), lambda row: None)
        store.add(record(2), lambda row: None)
        with pytest.raises(sqlite3.Error):
            await store.page(ActivityQuery())
    assert caplog.text.count("writing to") == 1
    await store.close()
