"""Live tails of a LogRing: new lines as they come, bounded backlog, clean close."""

from __future__ import annotations

import asyncio

from llmswap.process import LogRing


async def test_a_subscription_yields_lines_appended_after_it() -> None:
    ring = LogRing("m")
    ring.append("before")
    subscription = ring.subscribe()
    ring.append("one")
    ring.append("two")
    assert await anext(subscription) == "one"
    assert await anext(subscription) == "two"
    subscription.close()


async def test_a_waiting_reader_wakes_on_append() -> None:
    ring = LogRing("m")
    async with ring.subscribe() as subscription:
        reader = asyncio.create_task(anext(subscription))
        await asyncio.sleep(0)
        assert not reader.done()
        ring.append("hello")
        assert await asyncio.wait_for(reader, 5.0) == "hello"


async def test_closing_ends_the_iteration_and_unsubscribes() -> None:
    ring = LogRing("m")
    subscription = ring.subscribe()
    lines: list[str] = []

    async def read_all() -> None:
        async for line in subscription:
            lines.append(line)

    reader = asyncio.create_task(read_all())
    ring.append("a")
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    subscription.close()
    await asyncio.wait_for(reader, 5.0)
    ring.append("after close")
    assert lines == ["a"]
    assert subscription.closed


async def test_a_slow_reader_loses_its_oldest_lines_not_the_writer_memory() -> None:
    ring = LogRing("m")
    subscription = ring.subscribe(backlog=2)
    for index in range(5):
        ring.append(str(index))
    assert subscription.dropped == 3
    assert [await anext(subscription), await anext(subscription)] == ["3", "4"]
    subscription.close()


async def test_every_subscriber_gets_every_line() -> None:
    ring = LogRing("m")
    first, second = ring.subscribe(), ring.subscribe()
    ring.append("x")
    assert await anext(first) == "x"
    assert await anext(second) == "x"
    first.close()
    second.close()
