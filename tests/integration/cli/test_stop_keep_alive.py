"""A real `llmswap` process stopping while it serves a keep-alive connection: the answer finishes within the
grace, says `Connection: close`, the connection closes after it, and a connection that was idle is closed
at once."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import aiohttp

from tests.helpers.cli import demo_model, running_llmswap, write_config
from tests.helpers.demo import HOST
from tests.helpers.wait import eventually


def fast_chat(max_tokens: int) -> bytes:
    body = json.dumps({"model": "m", "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return head, await asyncio.wait_for(reader.readexactly(length), 30)


async def test_a_fast_answer_in_flight_at_sigterm_finishes_and_closes_its_connection(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", {"m": demo_model("m", "--tokens-per-second", "5")})
    async with running_llmswap(config) as server:
        idle_reader, idle_writer = await asyncio.open_connection(HOST, server.port)
        reader, writer = await asyncio.open_connection(HOST, server.port)
        try:
            idle_writer.write(fast_chat(1))  # answered, then the connection stays open, idle
            head, _ = await read_answer(idle_reader)
            assert head.startswith(b"HTTP/1.1 200") and b"connection: close" not in head.lower()
            writer.write(fast_chat(10))  # 10 tokens at 5 per second
            await writer.drain()

            async def in_flight() -> bool:
                async with aiohttp.ClientSession() as http, http.get(f"{server.url}/running") as response:
                    running = (await response.json())["running"]
                    return any(entry.get("in_flight") == 1 for entry in running)

            await eventually(in_flight, what="the slow request in flight")
            server.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(idle_reader.read(), 30) == b""  # the idle one is closed
            head, body = await read_answer(reader)
            assert await asyncio.wait_for(reader.read(), 30) == b""  # and this one after its answer
        finally:
            writer.close()
            idle_writer.close()
        assert head.startswith(b"HTTP/1.1 200"), head
        assert b"connection: close" in head.lower()
        assert json.loads(body)["object"] == "chat.completion"
        assert await server.wait_exit(30) == 0
        assert "Traceback" not in server.output(), server.output()[-4000:]
