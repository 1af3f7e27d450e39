"""`llmswap --workers 1` as a user runs it: real processes, the demo upstream, real HTTP. Every request is
answered whichever process took its connection; main keeps the one in-flight list, activity, access log
and counts; a request a worker does not serve moves to main on the same connection; main's cancel ends a
worker's request; a reload or a crash gives new workers and serving goes on, and a reload closes no
connection; the active profile reaches the workers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from llmswap.server.workers import MAIN_FIRST
from tests.helpers.cli import WITHIN, LlmswapProcess, demo_model, running_llmswap, together, write_config
from tests.helpers.wait import eventually

CHAT = "/v1/chat/completions"


def chat(model: str = "a", max_tokens: int = 4) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}


def config(tmp_path: Path, *flags: str) -> Path:
    preload = {"on_startup": {"preload": ["a"]}}
    return write_config(tmp_path / "config.yaml", {"a": demo_model("a", *flags)}, hooks=preload)


async def get(http: aiohttp.ClientSession, server: LlmswapProcess, path: str) -> Any:
    async with http.get(server.url + path) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def workers(http: aiohttp.ClientSession, server: LlmswapProcess) -> list[dict[str, int]]:
    return list((await get(http, server, "/api/workers"))["workers"])


async def ready(http: aiohttp.ClientSession, server: LlmswapProcess, *, not_pid: int | None = None) -> int:
    """The pid of the one worker, once it is connected (and is not `not_pid`)."""
    found: list[int] = []

    async def connected() -> bool:
        listed = await workers(http, server)
        found[:] = [w["pid"] for w in listed if w["pid"] != not_pid]
        return len(found) == 1

    await eventually(connected, within=WITHIN, what="a worker connected to main")
    await server.wait_for_output("preload: a ready", within=WITHIN)
    return found[0]


async def ask(http: aiohttp.ClientSession, server: LlmswapProcess) -> None:
    async with http.post(server.url + CHAT, json=chat()) as response:
        assert response.status == 200, await response.text()
        assert (await response.json())["usage"]["completion_tokens"] > 0


@contextlib.asynccontextmanager
async def sharing(server: LlmswapProcess) -> AsyncIterator[None]:
    """Idle connections enough that main shares new ones with the worker (it keeps a lone client's: see
    `llmswap.workers.turns`)."""
    idle = [await RawConnection.open(server) for _ in range(MAIN_FIRST)]
    try:
        yield
    finally:
        for connection in idle:
            connection.close()


async def served(http: aiohttp.ClientSession, server: LlmswapProcess) -> int:
    """What the workers served so far, every end that was on its way to main counted."""
    await get(http, server, "/api/metrics/activity?limit=1")  # settles with the workers
    return sum(w["served"] for w in await workers(http, server))


async def test_a_lone_client_is_served_by_main(tmp_path: Path) -> None:
    async with running_llmswap(config(tmp_path), "--workers", "1") as server, aiohttp.ClientSession() as http:
        await ready(http, server)
        for _ in range(3):  # new connections, one at a time
            async with aiohttp.ClientSession() as own:
                await ask(own, server)
        assert await served(http, server) == 0
        async with sharing(server), aiohttp.ClientSession() as own:
            await asyncio.gather(*(ask(own, server) for _ in range(10)))
            assert await served(http, server) > 0, "with main holding connections, new ones are shared"


async def test_workers_start_and_serve_under_asyncios_debug_mode(tmp_path: Path) -> None:
    debug = {"PYTHONASYNCIODEBUG": "1"}  # its checks refuse a blocking socket in the loop's socket calls
    async with running_llmswap(config(tmp_path), "--workers", "1", env=debug) as server, \
            aiohttp.ClientSession() as http, sharing(server):
        await ready(http, server)
        async with aiohttp.ClientSession() as own:
            await asyncio.gather(*(ask(own, server) for _ in range(10)))
        assert await served(http, server) > 0
        assert not [line for line in server.stdout_lines if "exited unexpectedly" in line]


async def test_every_request_is_answered_and_main_records_and_logs_each_one(tmp_path: Path) -> None:
    async with running_llmswap(config(tmp_path), "--workers", "1") as server, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=8)) as http:
        await ready(http, server)
        await asyncio.gather(*(ask(http, server) for _ in range(40)))  # on 8 connections, taken in turn
        [worker] = await workers(http, server)
        assert 0 < worker["served"] < 40, "the worker served some of them, main the others"
        rows = (await get(http, server, "/api/metrics/activity?limit=100"))["data"]
        chats = [row for row in rows if row["req_path"] == CHAT]
        assert len(chats) == 40 and len({row["id"] for row in chats}) == 40, "one row each, numbered by main"
        assert all(row["tokens"]["output_tokens"] > 0 and row["model"] == "a" for row in chats)
        assert sum(f'"POST {CHAT}" 200' in line for line in server.stdout_lines) == 40, "main logs each"
        metrics = await (await http.get(server.url + "/metrics")).text()
        [counted] = [line for line in metrics.splitlines() if line.startswith("llmswap_requests_total{")
                     and 'route="/v1/chat/completions"' in line and 'status="200"' in line]
        assert counted.endswith(" 40.0"), counted


async def test_a_request_a_worker_does_not_serve_moves_to_main_on_the_same_connection(tmp_path: Path) -> None:
    async with running_llmswap(config(tmp_path), "--workers", "1") as server, \
            aiohttp.ClientSession() as http, sharing(server):
        await ready(http, server)
        for _ in range(4):  # connections are shared in turn: some of these are the worker's
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as one_connection:
                await ask(one_connection, server)
                running = await get(one_connection, server, "/running")  # not a fast request
                assert [m["model"] for m in running["running"]] == ["a"]
                await ask(one_connection, server)  # and the connection goes on, now main's
        assert await served(http, server) >= 1


async def test_mains_cancel_ends_a_workers_request_and_the_model_serves_on(tmp_path: Path) -> None:
    async with running_llmswap(config(tmp_path, "--tokens-per-second", "5"), "--workers", "1") as server, \
            aiohttp.ClientSession() as http:
        await ready(http, server)

        async def slow() -> tuple[int, str]:
            async with aiohttp.ClientSession() as own, \
                    own.post(server.url + CHAT, json=chat(max_tokens=400)) as response:  # its own connection
                return response.status, await response.text()

        # Five new connections in a row: whatever the turn, some go to main and some to the worker.
        answers = [asyncio.create_task(slow()) for _ in range(5)]

        async def in_flight() -> list[dict[str, Any]]:
            return list((await get(http, server, "/api/inflight"))["requests"])

        async def all_in_flight() -> bool:
            return len(await in_flight()) == 5

        await eventually(all_in_flight, within=WITHIN, what="every request in flight")
        ids = {entry["id"] for entry in await in_flight()}
        for entry_id in ids:
            async with http.post(f"{server.url}/api/inflight/{entry_id}/cancel") as response:
                assert response.status == 200, await response.text()
        named = set()
        for status, text in await asyncio.gather(*answers):
            assert status == 502, text
            named.add(text.split("cancelled through /api/inflight/")[1].split("/")[0])
        assert named == ids, "each answer names the request as main's list showed it"

        async def none_in_flight() -> bool:  # a worker's request leaves as its end reaches main, just after
            return await in_flight() == []

        await eventually(none_in_flight, within=WITHIN, what="the list emptied")
        [worker] = await workers(http, server)
        assert 1 <= worker["served"] < 5
        await ask(http, server)


async def test_a_reload_or_a_crash_gives_a_new_worker_and_serving_goes_on(tmp_path: Path) -> None:
    async def asked_on_new_connections(server: LlmswapProcess) -> None:
        # New connections: the ones a stopped worker had are closed, and a killed one's die with it.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4)) as fresh:
            await asyncio.gather(*(ask(fresh, server) for _ in range(8)))

    async with running_llmswap(config(tmp_path), "--workers", "1") as server, aiohttp.ClientSession() as http:
        first = await ready(http, server)
        server.send_signal(signal.SIGHUP)
        second = await ready(http, server, not_pid=first)
        await asked_on_new_connections(server)
        os.kill(second, signal.SIGKILL)
        await ready(http, server, not_pid=second)
        await asked_on_new_connections(server)

        async def none_in_flight() -> bool:
            return (await get(http, server, "/api/inflight"))["requests"] == []

        await eventually(none_in_flight, within=WITHIN, what="nothing left in flight")


class RawConnection:
    """One keep-alive HTTP/1.1 connection of its own, read by hand: the test sees whether it stays open."""

    def __init__(self, host: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.host, self.reader, self.writer = host, reader, writer

    @classmethod
    async def open(cls, server: LlmswapProcess) -> RawConnection:
        host = server.url.removeprefix("http://")
        name, port = host.rsplit(":", 1)
        return cls(host, *await asyncio.open_connection(name, int(port)))

    def send(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        head = f"POST {CHAT} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
        self.writer.write(head.encode() + b"Content-Length: %d\r\n\r\n%s" % (len(data), data))

    async def answer(self) -> tuple[int, dict[str, str], bytes]:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), WITHIN)
        status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
        headers = {name.lower(): value.strip() for name, value in (line.split(":", 1) for line in lines)}
        body = await self.reader.readexactly(int(headers["content-length"]))
        return int(status_line.split()[1]), headers, body

    async def ask(self, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        self.send(body)
        return await self.answer()

    def close(self) -> None:
        self.writer.close()


async def test_a_reload_closes_no_connection_a_worker_held_idle_or_answering(tmp_path: Path) -> None:
    async with running_llmswap(config(tmp_path, "--tokens-per-second", "20"), "--workers", "1") as server, \
            aiohttp.ClientSession() as http, sharing(server):
        first = await ready(http, server)
        # New connections in a row until the worker holds three: two answer through the reload, one idles.
        connections: list[RawConnection] = []
        workers_own: list[RawConnection] = []
        while len(workers_own) < 3:
            assert len(connections) < 20, "the worker takes its share of new connections"
            connection = await RawConnection.open(server)
            before = await served(http, server)
            status, _, _ = await connection.ask(chat())
            assert status == 200
            connections.append(connection)
            if await served(http, server) > before:
                workers_own.append(connection)
        for connection in workers_own[:2]:
            connection.send(chat(max_tokens=20))  # answering through the reload (about a second each)
        await eventually(lambda: _in_flight(http, server, 2), within=WITHIN, what="two requests in flight")

        server.send_signal(signal.SIGHUP)
        second = await ready(http, server, not_pid=first)

        async def old_one_left() -> bool:
            return [w["pid"] for w in await workers(http, server)] == [second]

        await eventually(old_one_left, within=WITHIN, what="the old worker gone")
        await server.wait_for_output(f"worker 0 (pid {first}) stopped (exit status 0)", within=WITHIN)
        for connection in workers_own[:2]:
            status, headers, body = await connection.answer()
            assert status == 200 and "close" not in headers.get("connection", ""), headers
            assert json.loads(body)["usage"]["completion_tokens"] == 20
        for connection in connections:  # every connection is still open, wherever it went
            status, headers, _ = await connection.ask(chat())
            assert status == 200 and "close" not in headers.get("connection", ""), headers
            connection.close()
        assert sum(w["served"] for w in await workers(http, server)) >= 1, "the new worker took some back"


async def test_two_reloads_in_a_row_leave_one_new_worker_and_close_no_connection(tmp_path: Path) -> None:
    async with running_llmswap(config(tmp_path), "--workers", "1") as server, \
            aiohttp.ClientSession() as http, sharing(server):
        first = await ready(http, server)
        connections = [await RawConnection.open(server) for _ in range(5)]
        for connection in connections:
            assert (await connection.ask(chat()))[0] == 200

        server.send_signal(signal.SIGHUP)
        await server.wait_for_output("config reload: applied", within=WITHIN)
        server.send_signal(signal.SIGHUP)  # while the first reload's new worker is starting

        async def two_retired() -> bool:
            return sum("stopped (exit status 0)" in line for line in server.stdout_lines) == 2

        await eventually(two_retired, within=WITHIN, what="the first two workers gone by themselves")
        [last] = await workers(http, server)
        assert last["pid"] != first
        assert not [line for line in server.stdout_lines if ("[WARN]" in line or "[ERROR]" in line)
                    and ("worker" in line or "channel" in line)]
        for connection in connections:
            status, headers, _ = await connection.ask(chat())
            assert status == 200 and "close" not in headers.get("connection", ""), headers
            connection.close()


async def test_a_workers_answer_in_flight_at_the_stop_says_connection_close(tmp_path: Path) -> None:
    async with running_llmswap(config(tmp_path, "--tokens-per-second", "10"), "--workers", "1") as server, \
            aiohttp.ClientSession() as http, sharing(server):
        await ready(http, server)
        for _ in range(10):  # the first new connection the worker takes
            connection = await RawConnection.open(server)
            before = await served(http, server)
            await connection.ask(chat(max_tokens=1))
            if await served(http, server) > before:
                break
            connection.close()
        else:
            raise AssertionError("no connection went to the worker")
        connection.send(chat(max_tokens=10))  # about a second
        await eventually(lambda: _in_flight(http, server, 1), within=WITHIN, what="the request in flight")

        server.send_signal(signal.SIGTERM)

        status, headers, body = await connection.answer()
        assert status == 200 and headers.get("connection") == "close", headers
        assert json.loads(body)["usage"]["completion_tokens"] == 10
        assert await asyncio.wait_for(connection.reader.read(), WITHIN) == b""  # closed after it
        connection.close()
        assert await server.wait_exit(WITHIN) == 0


async def _in_flight(http: aiohttp.ClientSession, server: LlmswapProcess, count: int) -> bool:
    return len((await get(http, server, "/api/inflight"))["requests"]) == count


async def test_the_active_profile_reaches_the_workers(tmp_path: Path) -> None:
    models = {"a": demo_model("a"), "b": demo_model("b")}
    profiles = {"office": {"pins": {"a": "b"}}}
    path = write_config(tmp_path / "config.yaml", models, routing=together("a", "b"), profiles=profiles,
                        hooks={"on_startup": {"preload": ["a", "b"]}})
    async with running_llmswap(path, "--workers", "1") as server, aiohttp.ClientSession() as http, \
            sharing(server):
        await ready(http, server)
        await server.wait_for_output("preload: b ready", within=WITHIN)
        async with http.put(server.url + "/api/profiles/active", json={"name": "office"}) as response:
            assert response.status == 200, await response.text()

        async def answered_by_b() -> list[str]:
            async def one() -> str:
                async with aiohttp.ClientSession() as own, \
                        own.post(server.url + CHAT, json=chat("a")) as answer:
                    assert answer.status == 200, await answer.text()
                    return str((await answer.json())["model"])

            return await asyncio.gather(*(one() for _ in range(5)))  # new connections: some are the worker's

        async def pinned() -> bool:
            return await answered_by_b() == ["b"] * 5

        await eventually(pinned, within=WITHIN, what="every request for a answered by b")
        [worker] = await workers(http, server)
        assert worker["served"] >= 1
