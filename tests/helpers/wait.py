"""Wait for something another process does: poll a condition with a generous deadline, never a bare sleep."""

import asyncio
from collections.abc import Awaitable, Callable


async def eventually(
    condition: Callable[[], Awaitable[bool]],
    *,
    within: float = 15.0,
    interval: float = 0.02,
    what: str = "the condition",
) -> None:
    """Return once ``condition()`` is true; fail naming ``what`` if it is still false after ``within`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        if await condition():
            return
        if loop.time() > deadline:
            raise AssertionError(f"{what} did not happen within {within} s")
        await asyncio.sleep(interval)
