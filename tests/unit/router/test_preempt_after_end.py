"""Preemptions at the edges of a request's life: one the scheduler decides after the request ended (its
ServeDone still in the run loop's queue) must not cancel what the serving task does next (a task lane records
the answer it just got); one decided before the granted waiter resumed ends it with Preempted."""

from __future__ import annotations

import asyncio

import pytest

from llmswap.router import AcquireOptions
from llmswap.scheduler.errors import Preempted
from llmswap.scheduler.types import HandlerRequest
from tests.helpers.fake_process import FakeProcess, FakeScript
from tests.unit.router.test_router import config, make_router


async def test_a_preemption_after_the_request_ended_does_not_cancel_its_task() -> None:
    router, _ = make_router(config("a"))
    granted: list[HandlerRequest] = []
    grant_serve = router.work.grant_serve

    def recording_grant(req: HandlerRequest, model: str) -> bool:
        granted.append(req)
        return grant_serve(req, model)

    router.work.grant_serve = recording_grant  # type: ignore[method-assign]

    async def serve_then_record() -> str:
        async with router.acquire("a", AcquireOptions(priority=-10)):
            pass
        # Ended; as if the run loop read a higher-priority request before this one's ServeDone.
        router.work.preempt(granted[0], "preempted late (routing.scheduler.settings.preemptBelow: 0)")
        await asyncio.sleep(0)  # where the lane would write its answer to the database
        return "recorded"

    try:
        assert await asyncio.create_task(serve_then_record()) == "recorded"
    finally:
        await router.shutdown()


async def test_a_preemption_between_the_grant_and_the_waiter_resuming_ends_it_with_preempted() -> None:
    # The grant lands on a waiting request and, in the same run-loop step (before its task resumes, so
    # there is no task to cancel yet), the scheduler preempts it: it must raise Preempted and be counted
    # out, by the scheduler and by its process.
    script = FakeScript(start_delay=lambda model: 0.01)
    router, _ = make_router(config("a"), script)
    grant_serve = router.work.grant_serve

    def grant_then_preempt(req: HandlerRequest, model: str) -> bool:
        granted = grant_serve(req, model)
        router.work.preempt(req, "preempted at once (routing.scheduler.settings.preemptBelow: 0)")
        return granted

    router.work.grant_serve = grant_then_preempt  # type: ignore[method-assign]
    try:
        with pytest.raises(Preempted, match="preempted at once"):
            async with router.acquire("a", AcquireOptions(priority=-10)):  # waits for the load
                raise AssertionError("never served")
        await router.wait_idle()
        assert router.snapshot().in_flight == {}
        process = router.processes["a"]
        assert isinstance(process, FakeProcess) and process.in_flight == 0
    finally:
        await router.shutdown()
