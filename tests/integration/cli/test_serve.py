"""`llmswap --config FILE` as a real process: serving, preload, graceful and hurried stops, logging."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from pathlib import Path

import aiohttp

from tests.helpers.cli import WITHIN, alive, demo_model, running_llmswap, stop_with, together, write_config
from tests.helpers.demo import HOST
from tests.helpers.sse import parse_events
from tests.helpers.wait import eventually


def chat(model: str, *, stream: bool = False, max_tokens: int = 8) -> dict[str, object]:
    return {"model": model, "stream": stream, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "hello"}]}


async def test_serves_a_chat_request_and_sigterm_stops_every_upstream(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", {"small": demo_model("small"), "big": demo_model("big")},
                          routing=together("small", "big"))
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        for model in ("small", "big"):
            async with http.post(f"{server.url}/v1/chat/completions", json=chat(model)) as response:
                assert response.status == 200, await response.text()
                body = await response.json()
            assert body["model"] == model
            assert f"demo {model} says" in body["choices"][0]["message"]["content"]
        upstreams = server.upstreams()
        assert set(upstreams) == {"small", "big"}
        assert await stop_with(server, signal.SIGTERM) == 0
        for pid in upstreams.values():
            assert not alive(pid)
        await server.wait_for_output("llmswap stopped")


async def test_sigterm_lets_a_streaming_response_finish(tmp_path: Path) -> None:
    # 20 tokens at 40/s: the stream is still running when the signal arrives, and ends within the grace.
    config = write_config(tmp_path / "config.yaml", {"slow": demo_model("slow", "--tokens-per-second", "40")})
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        request = chat("slow", stream=True, max_tokens=20)
        async with http.post(f"{server.url}/v1/chat/completions", json=request) as response:
            assert response.status == 200
            first = await response.content.readline()
            assert first.startswith(b"data: ")
            upstream = server.upstreams()["slow"]
            server.send_signal(signal.SIGTERM)
            rest = await response.read()
        events = parse_events((first + rest).decode())
        assert events[-1].data == "[DONE]"
        assert await server.wait_exit(WITHIN) == 0
        assert not alive(upstream)


async def test_sigterm_closes_open_websockets_as_going_away(tmp_path: Path) -> None:
    # A socket has no end of its own: the server closes it with 1001 rather than waiting out the grace
    # period and then cutting the connection.
    config = write_config(tmp_path / "config.yaml", {"m": demo_model("m")})
    async with (
        running_llmswap(config) as server,
        aiohttp.ClientSession() as http,
        http.ws_connect(f"{server.url}/upstream/m/ws") as socket,
    ):
        assert (await socket.receive_json(timeout=WITHIN))["model"] == "m"
        upstream = server.upstreams()["m"]
        server.send_signal(signal.SIGTERM)
        message = await socket.receive(timeout=WITHIN)
        assert message.type is aiohttp.WSMsgType.CLOSE and message.data == 1001
        assert await server.wait_exit(WITHIN) == 0
        assert not alive(upstream)


async def test_new_connections_are_refused_once_stopping(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", {"slow": demo_model("slow", "--tokens-per-second", "20")})
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        request = chat("slow", stream=True, max_tokens=40)
        async with http.post(f"{server.url}/v1/chat/completions", json=request) as response:
            await response.content.readline()
            server.send_signal(signal.SIGTERM)
            await server.wait_for_output("shutting down")

            async def refused() -> bool:
                try:
                    async with aiohttp.ClientSession() as fresh, fresh.get(f"{server.url}/health") as probe:
                        await probe.read()
                        return False
                except aiohttp.ClientConnectionError:
                    return True

            await eventually(refused, within=WITHIN, what="the listener to close")
            await response.read()
        assert await server.wait_exit(WITHIN) == 0


async def test_second_signal_cuts_the_responses_in_flight(tmp_path: Path) -> None:
    # 2 tokens/s for 200 tokens: this stream would outlast any grace period.
    config = write_config(tmp_path / "config.yaml", {"slow": demo_model("slow", "--tokens-per-second", "2")})
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        request = chat("slow", stream=True, max_tokens=200)
        async with http.post(f"{server.url}/v1/chat/completions", json=request) as response:
            await response.content.readline()
            upstream = server.upstreams()["slow"]
            server.send_signal(signal.SIGINT)
            await server.wait_for_output("shutting down")
            server.send_signal(signal.SIGINT)
            try:
                rest = await response.read()
            except aiohttp.ClientPayloadError:
                rest = b""
        chunks = [e.json() for e in parse_events(rest.decode()) if e.data != "[DONE]"]
        # Cut short: no chunk ever says the generation finished (an error event may say why it stopped).
        assert not any(c.get("choices") and c["choices"][0].get("finish_reason") for c in chunks)
        assert await server.wait_exit(WITHIN) == 0
        await server.wait_for_output("again: cutting responses in flight")
        assert not alive(upstream)


async def test_preload_loads_models_in_order_at_startup(tmp_path: Path) -> None:
    # One exclusive group: preloading a then b leaves only b, as llama-swap does.
    config = write_config(tmp_path / "config.yaml", {"a": demo_model("a"), "b": demo_model("b")},
                          hooks={"on_startup": {"preload": ["a", "b"]}})
    async with running_llmswap(config) as server:
        await server.wait_for_output("preload: b ready", within=WITHIN)
        assert any("preload: a ready" in line for line in server.stdout_lines)
        assert set(server.upstreams()) == {"b"}


async def test_a_model_that_fails_to_preload_does_not_stop_the_server(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml",
                          {"broken": demo_model("broken", "--exit-after", "0"), "ok": demo_model("ok")},
                          routing=together("broken", "ok"),
                          hooks={"on_startup": {"preload": ["broken", "ok"]}})
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        await server.wait_for_output("preload: ok ready", within=WITHIN)
        assert any("preload: broken did not load" in line for line in server.stdout_lines)
        async with http.post(f"{server.url}/v1/chat/completions", json=chat("ok")) as response:
            assert response.status == 200


async def test_busy_listen_address_exits_1_naming_it(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", {"a": demo_model("a")})
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with running_llmswap(config, port=port, healthy=False) as server:
            assert await server.wait_exit(WITHIN) == 1
            line = await server.wait_for_output("cannot listen", stderr=True)
            assert f"{HOST}:{port}" in line
            assert "--listen" in line
            assert not any("Traceback" in err for err in server.stderr_lines)
        # Under `make run` the way to choose the address is make's own (the Makefile says so).
        hint = {"LLMSWAP_LISTEN_HINT": "make run LISTEN=HOST:PORT"}
        async with running_llmswap(config, port=port, healthy=False, env=hint) as server:
            assert await server.wait_exit(WITHIN) == 1
            line = await server.wait_for_output("cannot listen", stderr=True)
            assert line.endswith("choose another address with make run LISTEN=HOST:PORT")


async def test_log_options_shape_stdout(tmp_path: Path) -> None:
    # Timestamps in rfc3339, upstream output on stdout too, and --log-level info over the file's "error".
    config = write_config(tmp_path / "config.yaml", {"a": demo_model("a", "--log-requests")},
                          logLevel="error", logToStdout="both", logTimeFormat="rfc3339")
    async with running_llmswap(config, "--log-level", "info") as server, aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}/v1/chat/completions", json=chat("a")) as response:
            assert response.status == 200
        line = await server.wait_for_output("listening on")
        stamp, level = line.split(" ")[:2]
        assert stamp[4] == "-" and "T" in stamp
        assert level == "[INFO]"
        await server.wait_for_output("[a] ")  # an upstream line, prefixed by its model


async def test_log_to_stdout_none_keeps_stdout_quiet_but_logs_are_served(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", {"a": demo_model("a")}, logToStdout="none")
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}/v1/chat/completions", json=chat("a")) as response:
            assert response.status == 200
        async with http.get(f"{server.url}/logs/stream/proxy") as logs:
            assert logs.status == 200
            text = (await logs.content.readuntil(b"listening on")).decode()
        assert "listening on" in text
        assert await stop_with(server) == 0
        assert server.stdout_lines == []


async def test_at_the_grace_deadline_answers_still_running_end_with_an_error_and_llmswap_exits(
    tmp_path: Path,
) -> None:
    # 2 tokens a second for 200 tokens: both answers would run for 100 s, far past a 1 s grace.
    config = write_config(tmp_path / "config.yaml", {"slow": demo_model("slow", "--tokens-per-second", "2")})
    async with running_llmswap(config, "--shutdown-grace", "1") as server, aiohttp.ClientSession() as http:
        url = f"{server.url}/v1/chat/completions"
        async with http.post(url, json=chat("slow", stream=True, max_tokens=200)) as stream:
            first = await stream.content.readline()
            whole = asyncio.ensure_future(http.post(url, json=chat("slow", max_tokens=200)))

            async def both_in_flight() -> bool:
                async with http.get(f"{server.url}/api/inflight") as listing:
                    return len((await listing.json())["requests"]) == 2

            await eventually(both_in_flight, what="the stream and the whole answer in flight")
            upstream = server.upstreams()["slow"]
            signalled = time.monotonic()
            server.send_signal(signal.SIGINT)
            rest = await stream.read()
        answer = await whole
        body = await answer.json()
        answer.close()
        code = await server.wait_exit(WITHIN)
        took = time.monotonic() - signalled
    events = parse_events((first + rest).decode())
    assert events[-1].data == "[DONE]"
    error = events[-2].json()["error"]
    assert "shutting down" in error["message"] and "1s shutdown grace" in error["message"]
    assert (answer.status, body["error"]["message"]) == (503, error["message"])
    assert code == 0 and not alive(upstream)
    assert took < 100 / 4  # the answers' own length was 100 s: they were cut, not waited for
    cut_lines = [line for line in server.stdout_lines if "cut=shutdown" in line]
    assert len(cut_lines) == 2, server.output()
    assert any("cut 2 requests still in flight" in line for line in server.stdout_lines)


async def test_a_plain_start_load_and_reload_log_only_what_a_user_reads(tmp_path: Path) -> None:
    # No NVML notice, no health-probe lines (llmswap's or the demo's), no favicon 404; the reload says
    # which model kept running and which did not.
    config = write_config(tmp_path / "config.yaml", {"a": demo_model("a", "--log-requests"),
                                                     "b": demo_model("b")}, logToStdout="both")
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}/v1/chat/completions", json=chat("a")) as response:
            assert response.status == 200
        async with http.get(f"{server.url}/favicon.ico") as response:
            assert response.status == 404
        await server.wait_for_output("request POST /v1/chat/completions")  # the demo's own line
        server.send_signal(signal.SIGHUP)
        line = await server.wait_for_output("config reload: applied")
        assert line.endswith("config reload: applied; kept running: a; kept, not running: b")
    output = "\n".join(server.stdout_lines)
    assert f"the status page is {server.url}/ui" in output  # where a newcomer looks next
    for quiet in ("NVML", "Health check passed", "GET /health", "favicon"):
        assert quiet not in output, output


async def test_a_stream_through_upstream_is_cut_at_the_grace_deadline_like_any_other(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", {"slow": demo_model("slow", "--tokens-per-second", "2")})
    async with running_llmswap(config, "--shutdown-grace", "1") as server, aiohttp.ClientSession() as http:
        url = f"{server.url}/upstream/slow/v1/chat/completions"
        async with http.post(url, json=chat("slow", stream=True, max_tokens=200)) as stream:
            first = await stream.content.readline()
            server.send_signal(signal.SIGINT)
            rest = await stream.read()
        code = await server.wait_exit(WITHIN)
    events = parse_events((first + rest).decode())
    assert events[-1].data == "[DONE]"
    assert "shutting down" in events[-2].json()["error"]["message"]
    assert code == 0
    assert any("cut=shutdown" in line and "/upstream/slow/" in line for line in server.stdout_lines)


async def test_a_failed_start_is_logged_in_full_once(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", {"crash": demo_model("crash", "--exit-after", "0")})
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}/v1/chat/completions", json=chat("crash")) as response:
            assert response.status >= 500
        swap_line = await server.wait_for_output("swap: crash failed after")
    output = server.stdout_lines + server.stderr_lines
    quoted = [line for line in output if "exiting with code 3" in line]
    assert len(quoted) == 1, "\n".join(output)  # quoted by the start failure, not again by the swap
    assert swap_line.endswith("upstream command exited prematurely (exit code 3) (the server's last output "
                              "is in the lines above)")
