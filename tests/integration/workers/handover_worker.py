"""A worker process for the hand-over tests: `python handover_worker.py LISTEN_FD CHANNEL_FD`.

It serves the inherited listening socket with `WorkerSide` (answering `/worker...` itself, handing every
other connection to main over the inherited channel) until it is signalled.
"""

from __future__ import annotations

import asyncio
import socket
import sys

from llmswap.workers.handover import HandOverSender
from tests.integration.workers.peers import WorkerSide


async def main(listen_fd: int, channel_fd: int) -> None:
    listener = socket.socket(fileno=listen_fd)
    sender = HandOverSender(socket.socket(fileno=channel_fd))
    server = await asyncio.get_running_loop().create_server(lambda: WorkerSide(sender), sock=listener)
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
