"""Client connections against a real `llmswap` process: a low open-file limit raised at start (400 requests in
flight at once), idle and slowloris sockets closed after clientHeaderTimeout while /health answers, running
out of descriptors logged as one warning, and `Connection: close` on every response once SIGTERM arrived."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

import aiohttp

from tests.helpers.cli import LlmswapProcess, demo_model, running_llmswap, write_config
from tests.helpers.demo import HOST
from tests.helpers.wait import eventually

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def no_traceback(server: LlmswapProcess) -> None:
    assert "Traceback" not in server.output(), server.output()[-4000:]


async def health(server: LlmswapProcess) -> int:
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as http, http.get(f"{server.url}/health") as response:
        return response.status


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """Whether the server closed this connection (reads up to its end; a stalled read means open)."""
    try:
        while await asyncio.wait_for(reader.read(65536), 0.05):
            pass
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return True


async def test_a_low_open_file_limit_is_raised_so_400_requests_are_served_at_once(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", {
        "m": demo_model("m", "--tokens-per-second", "8", concurrencyLimit=500),
    })
    async with running_llmswap(config, open_files=(256, -1)) as server:
        assert "open-file limit raised from 256" in server.output(), server.output()
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            url = f"{server.url}/v1/chat/completions"

            async def one() -> int:  # 4 tokens at 8 per second: every request is in flight at once
                async with http.post(url, json={**CHAT, "max_tokens": 4}) as response:
                    await response.read()
                    return response.status

            statuses = await asyncio.gather(*(one() for _ in range(400)))
        assert statuses.count(200) == 400, sorted(set(statuses))
        no_traceback(server)


async def test_idle_and_slowloris_connections_are_closed_while_health_answers(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", {"m": demo_model("m")}, clientHeaderTimeout=1.5)
    async with running_llmswap(config) as server:
        idle = [await asyncio.open_connection(HOST, server.port) for _ in range(60)]
        slow = [await asyncio.open_connection(HOST, server.port) for _ in range(60)]
        head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 10_000

        async def trickle(writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                for byte in head:  # never a complete head, one byte at a time
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(0.1)

        tricklers = [asyncio.create_task(trickle(writer)) for _, writer in slow]
        try:
            assert await health(server) == 200  # answered while 120 sockets hang on
            pending = [reader for reader, _ in idle + slow]

            async def all_closed() -> bool:
                pending[:] = [reader for reader in pending if not await closed_by_server(reader)]
                return not pending

            await eventually(all_closed, within=30, interval=0.2, what="idle and slow sockets closed")
            assert await health(server) == 200
        finally:
            for task in tricklers:
                task.cancel()
            for _, writer in idle + slow:
                writer.close()
        no_traceback(server)


async def test_running_out_of_descriptors_is_one_warning_and_service_resumes(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", {"m": demo_model("m")}, clientHeaderTimeout=2)
    async with running_llmswap(config, open_files=(64, 64)) as server:
        sockets = [await asyncio.open_connection(HOST, server.port) for _ in range(90)]  # more than 64
        try:
            await server.wait_for_output("out of file descriptors", within=20)
            pending = [reader for reader, _ in sockets]

            async def all_closed() -> bool:
                pending[:] = [reader for reader in pending if not await closed_by_server(reader)]
                return not pending

            await eventually(all_closed, within=40, interval=0.2, what="every idle socket closed")
        finally:
            for _, writer in sockets:
                writer.close()
        assert await health(server) == 200
        assert server.output().count("out of file descriptors") == 1, server.output()
        no_traceback(server)


async def test_every_response_once_sigterm_arrived_says_connection_close(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", {"m": demo_model("m", "--tokens-per-second", "5")})
    async with running_llmswap(config) as server:
        url = f"{server.url}/v1/chat/completions"
        async with aiohttp.ClientSession() as http, http.post(url, json={**CHAT, "max_tokens": 1}) as warm:
            assert warm.status == 200  # the model is loaded

        reader, writer = await asyncio.open_connection(HOST, server.port)
        try:
            writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # a keep-alive connection in use
            await writer.drain()
            first = await reader.readuntil(b"\r\n\r\nOK")
            assert b"Connection: close" not in first
            body = b'{"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}'
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))  # 10 tokens at 5 per second
            await writer.drain()

            async def in_flight() -> bool:
                async with aiohttp.ClientSession() as http, http.get(f"{server.url}/running") as response:
                    running = (await response.json())["running"]
                    return any(entry.get("in_flight") == 1 for entry in running)

            await eventually(in_flight, what="the slow request in flight")
            server.send_signal(signal.SIGTERM)
            answer = await asyncio.wait_for(reader.read(), 30)  # read until the server closes
        finally:
            writer.close()
        head = answer.split(b"\r\n\r\n", 1)[0].decode()
        assert head.startswith("HTTP/1.1 200"), answer[:300]
        assert "connection: close" in head.lower(), (head, server.output())
        assert await server.wait_exit(30) == 0
        no_traceback(server)
