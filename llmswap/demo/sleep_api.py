"""vLLM's sleep API, as the demo speaks it with `--enable-sleep-mode` (vLLM mounts it with
`VLLM_SERVER_DEV_MODE=1` and `--enable-sleep-mode`):

    POST /sleep?level=1&mode=wait   frees the (fake) GPU memory after --sleep-delay seconds; 200, empty
    POST /wake_up                   takes it back after --wake-delay seconds; 200, empty
    GET  /is_sleeping               {"is_sleeping": true|false}

While asleep `/health` stays 200 (as vLLM's does) and an inference request waits until the next wake, as
current vLLM's paused scheduler holds it. With `--fake-vram`, the claim file goes while asleep and comes back
on waking, so the vram router sees the memory freed. Without the flag these paths answer 404.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from llmswap.demo.console import say


class Sleep:
    """Asleep or awake; `awake` is set while awake, so requests wait on it."""

    def __init__(self, sleep_delay: float, wake_delay: float, *, on_change: Callable[[bool], None]) -> None:
        self.sleep_delay = sleep_delay
        self.wake_delay = wake_delay
        self.awake = asyncio.Event()
        self.awake.set()
        self.level = 0
        self._on_change = on_change

    @property
    def sleeping(self) -> bool:
        return not self.awake.is_set()

    async def put_to_sleep(self, level: int) -> None:
        await asyncio.sleep(self.sleep_delay)
        self.level = level
        if not self.sleeping:
            self.awake.clear()
            self._on_change(True)
            say(f"asleep (level {level})")

    async def wake_up(self) -> None:
        await asyncio.sleep(self.wake_delay)
        if self.sleeping:
            self.level = 0
            self.awake.set()
            self._on_change(False)
            say("awake")


def routes(sleep: Sleep) -> list[web.RouteDef]:
    async def sleep_route(request: web.Request) -> web.Response:
        level = request.query.get("level", "1")
        if level not in ("1", "2"):
            return web.json_response({"error": f"level must be 1 or 2, got {level!r}"}, status=400)
        await sleep.put_to_sleep(int(level))
        return web.Response()

    async def wake_route(request: web.Request) -> web.Response:
        await sleep.wake_up()
        return web.Response()

    async def is_sleeping(request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": sleep.sleeping})

    return [web.post("/sleep", sleep_route), web.post("/wake_up", wake_route),
            web.get("/is_sleeping", is_sleeping)]
