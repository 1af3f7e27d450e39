"""wait_for_free: poll a reader until the freed memory is visible, or give up quietly."""

from __future__ import annotations

import asyncio

from llmswap.machine import FakeReader, GiB, wait_for_free


async def test_wait_for_free_returns_at_once_when_memory_is_already_free() -> None:
    reader = FakeReader([24 * GiB])
    reader.set_extra_used(0, 20 * GiB)
    waited = await wait_for_free(reader, {0: 4 * GiB}, timeout=30)
    assert 0 <= waited < 30


async def test_wait_for_free_waits_until_another_task_frees_memory() -> None:
    reader = FakeReader([24 * GiB, 24 * GiB])
    reader.set_extra_used(0, 20 * GiB)
    reader.set_extra_used(1, 22 * GiB)
    waiter = asyncio.create_task(wait_for_free(reader, {0: 10 * GiB, 1: 2 * GiB}, timeout=30, interval=0.01))
    for _ in range(5):
        await asyncio.sleep(0.01)
    assert not waiter.done()  # device 0 still has only 4 GiB free

    reader.set_extra_used(0, 8 * GiB)  # the evicted model's memory comes back
    waited = await asyncio.wait_for(waiter, timeout=30)
    assert 0 < waited < 30
    assert [d.free for d in reader.devices()] == [16 * GiB, 2 * GiB]


async def test_wait_for_free_gives_up_after_the_timeout_without_raising() -> None:
    reader = FakeReader([24 * GiB])
    reader.set_extra_used(0, 23 * GiB)
    waited = await wait_for_free(reader, {0: 4 * GiB}, timeout=0.05, interval=0.01)
    assert waited >= 0.05  # the caller learns it timed out by comparing with its timeout


async def test_wait_for_free_ignores_devices_the_reader_does_not_have() -> None:
    reader = FakeReader([24 * GiB])
    waited = await wait_for_free(reader, {0: 1 * GiB, 3: 8 * GiB}, timeout=30)
    assert waited < 30
