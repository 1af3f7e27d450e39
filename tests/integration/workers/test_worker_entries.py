"""A worker's requests in the main process's in-flight list: listed as its own are, gone when they end;
the list's cancel reaches the worker."""

from __future__ import annotations

import asyncio

from llmswap.router.types import NO_OPTIONS
from llmswap.server.inflight import InflightTracker
from llmswap.server.worker_entries import TrackedEntries
from tests.integration.workers.test_grants import SHOWN, Pair, started
from tests.unit.dispatch.test_lease_now import config


async def test_a_workers_request_is_in_mains_in_flight_list_and_its_cancel_reaches_the_worker() -> None:
    tracker = InflightTracker()
    pair = await started(Pair(config("a"), TrackedEntries(tracker)), "a")
    told: list[tuple[str, str]] = []
    tracker.listeners.append(lambda operation, entry: told.append((operation, entry.model)))
    cancelled: list[str | None] = []
    heard = asyncio.Event()

    def cancel(shown_id: str | None) -> None:
        cancelled.append(shown_id)
        heard.set()

    shown = SHOWN._replace(headers=(*SHOWN.headers, ("Authorization", "Bearer sk-secret")))
    async with pair.leases.lease(pair.cfg.models["a"], NO_OPTIONS, shown, cancel):
        [entry] = tracker.entries()
        row = entry.as_dict(entry.started_monotonic)
        assert (row["model"], row["method"], row["req_path"], row["remote_ip"]) == (
            "a", "POST", "/v1/chat/completions", "127.0.0.1")
        assert row["req_headers"] == {"Content-Type": "application/json", "Authorization": "[REDACTED]"}
        assert tracker.cancel(entry.id) is True  # POST /api/inflight/{id}/cancel
        await heard.wait()
        assert cancelled == [entry.id], "the worker learns the id main's list shows"
    await pair.settle()
    assert tracker.entries() == [] and told == [("upsert", "a"), ("remove", "a")]
    await pair.main.router.shutdown()
