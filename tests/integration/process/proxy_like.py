"""A stand-in for the proxy: starts one Process for a demo upstream, prints its pid, then waits forever.

Run by test_parent_death.py as `python -m tests.integration.process.proxy_like PORT`, then SIGKILLed.
"""

from __future__ import annotations

import asyncio
import sys

from llmswap.config.model import ModelConfig
from llmswap.process import Process


async def main(port: int) -> None:
    config = ModelConfig(
        id="orphan-candidate",
        cmd=(sys.executable, "-m", "llmswap.demo", "--port", str(port), "--model-name", "orphan-candidate"),
        proxy=f"http://127.0.0.1:{port}",
        health_check_timeout=30,
    )
    process = Process(config)
    await process.ensure_ready()
    print(f"upstream pid={process.pid}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
