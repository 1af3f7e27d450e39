from collections.abc import AsyncIterator

import aiohttp
import pytest_asyncio


# Every test module here runs on a module-wide event loop, so that one demo process can serve a whole module.
@pytest_asyncio.fixture(loop_scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session
