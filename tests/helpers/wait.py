"""Wait for something another process does: poll a condition with a generous deadline, never a bare sleep."""

import asyncio
import inspect
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


async def until(
    predicate: Callable[[], bool | Awaitable[bool]],
    *,
    what: str = "the condition",
    within: float = 15.0,
    interval: float = 0.02,
) -> None:
    """`eventually` for a predicate that may be plain or async: router state, a counter, or an async check
    such as an upstream's /props. In-process state changes fast: poll it with a short `interval`."""

    async def check() -> bool:
        result = predicate()
        return bool(await result) if inspect.isawaitable(result) else bool(result)

    await eventually(check, within=within, interval=interval, what=what)
