"""A preemption the scheduler decides after a request ended (its ServeDone still in the run loop's queue)
must not cancel what the serving task does next: a task lane records the answer it just got."""

from __future__ import annotations

import asyncio

from llmswap.router import AcquireOptions
from llmswap.scheduler.types import HandlerRequest
from tests.unit.router.test_base_router import config, make_router


async def test_a_preemption_after_the_request_ended_does_not_cancel_its_task() -> None:
    router, _ = make_router(config("a"))
    granted: list[HandlerRequest] = []
    grant_serve = router.grant_serve

    def recording_grant(req: HandlerRequest, model: str) -> bool:
        granted.append(req)
        return grant_serve(req, model)

    router.grant_serve = recording_grant  # type: ignore[method-assign]

    async def serve_then_record() -> str:
        async with router.acquire("a", AcquireOptions(priority=-10)):
            pass
        # Ended; as if the run loop read a higher-priority request before this one's ServeDone.
        router.preempt(granted[0], "preempted late (routing.scheduler.settings.preemptBelow: 0)")
        await asyncio.sleep(0)  # where the lane would write its answer to the database
        return "recorded"

    try:
        assert await asyncio.create_task(serve_then_record()) == "recorded"
    finally:
        await router.shutdown()
