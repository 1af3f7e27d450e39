"""The failure knobs do what they say: crash, SIGTERM handling, echo, grandchild, request log, bad flags."""

import os
import signal
import socket

import aiohttp
import pytest

from llmswap.demo.fake_gpu import pid_alive
from tests.helpers.demo import running_demo
from tests.helpers.sse import parse_events
from tests.helpers.wait import eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_exit_after_crashes_a_serving_demo_with_code_3(http: aiohttp.ClientSession) -> None:
    # Healthy at once and only crashing seconds later, so it is surely serving when it dies.
    async with running_demo("crashy", ["--exit-after", "2"]) as demo:
        async with http.get(f"{demo.url}/v1/models") as response:
            assert response.status == 200
        assert await demo.wait_exit() == 3
        await demo.wait_for_output("--exit-after 2 s has passed", stderr=True)


async def test_exit_after_crashes_a_demo_still_starting(http: aiohttp.ClientSession) -> None:
    flags = ["--startup-delay", "30", "--exit-after", "0.3"]
    async with running_demo("crashy", flags, wait_until="started") as demo:
        assert await demo.wait_exit() == 3
        assert not any("first healthy" in line for line in demo.stdout_lines)


async def test_sigterm_stops_the_demo_gracefully_with_code_0(http: aiohttp.ClientSession) -> None:
    async with running_demo("polite") as demo:
        demo.send_signal(signal.SIGTERM)
        assert await demo.wait_exit() == 0


async def test_ignore_sigterm_survives_sigterm_and_dies_on_sigkill(http: aiohttp.ClientSession) -> None:
    async with running_demo("stubborn", ["--ignore-sigterm"]) as demo:
        demo.send_signal(signal.SIGTERM)
        # An ignored signal is discarded when it is sent, so a request answered after that proves survival.
        async with http.get(f"{demo.url}/health") as response:
            assert response.status == 200
        assert demo.returncode is None
        demo.send_signal(signal.SIGKILL)
        assert await demo.wait_exit() == -signal.SIGKILL


async def test_echo_reflects_method_path_query_headers_and_body(http: aiohttp.ClientSession) -> None:
    async with running_demo("mirror", ["--echo"]) as demo:
        body = {"model": "rewritten", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        headers = {"Authorization": "Bearer sk-upstream", "X-Trace": "abc"}
        async with http.post(
            f"{demo.url}/v1/chat/completions", params={"debug": "1"}, json=body, headers=headers
        ) as response:
            echo = (await response.json())["echo"]
        assert echo["method"] == "POST"
        assert echo["path"] == "/v1/chat/completions"
        assert echo["query"] == {"debug": "1"}
        assert echo["headers"]["Authorization"] == "Bearer sk-upstream"
        assert echo["headers"]["X-Trace"] == "abc"
        assert echo["body"] == body

        async with http.post(f"{demo.url}/v1/chat/completions", json={**body, "stream": True}) as response:
            events = parse_events(await response.text())
        assert events[0].json()["echo"]["body"] == {**body, "stream": True}
        assert all("echo" not in event.json() for event in events[1:-1])

        async with http.get(f"{demo.url}/upstream/anything?x=1") as response:
            assert response.status == 404
            not_found = await response.json()
        assert not_found["echo"]["path"] == "/upstream/anything"
        assert not_found["echo"]["query"] == {"x": "1"}

        form = aiohttp.FormData()
        form.add_field("file", b"1234567", filename="a.wav")
        form.add_field("model", "whisper")
        async with http.post(f"{demo.url}/v1/audio/transcriptions", data=form) as response:
            posted = (await response.json())["echo"]["body"]
        assert posted["model"] == "whisper"
        assert posted["file"] == {"filename": "a.wav", "content_type": "application/octet-stream", "size": 7}

        async with http.post(f"{demo.url}/v1/embeddings", data=b"plain text") as response:
            assert response.status == 400
            assert (await response.json())["echo"]["body"] == "plain text"


async def test_spawn_grandchild_shares_the_group_and_outlives_a_graceful_exit(
    http: aiohttp.ClientSession,
) -> None:
    async with running_demo("parent", ["--spawn-grandchild"]) as demo:
        line = await demo.wait_for_output("llmswap-demo: grandchild pid=")
        grandchild = int(line.rsplit("=", 1)[1])
        assert pid_alive(grandchild)
        assert os.getpgid(grandchild) == os.getpgid(demo.pid)
        # The demo does not reap its own group: whoever runs it must kill the group, as the proxy does.
        demo.send_signal(signal.SIGTERM)
        assert await demo.wait_exit() == 0
        assert pid_alive(grandchild)

    async def gone() -> bool:
        return not pid_alive(grandchild)

    await eventually(gone, what=f"grandchild {grandchild} dying with its process group")


async def test_log_requests_prints_one_line_per_request(http: aiohttp.ClientSession) -> None:
    async with running_demo("chatty", ["--log-requests"]) as demo:
        async with http.post(f"{demo.url}/v1/embeddings", json={"model": "emb", "input": "x"}):
            pass
        async with http.get(f"{demo.url}/v1/models"):
            pass
        await demo.wait_for_output("request POST /v1/embeddings model=emb")
        await demo.wait_for_output("request GET /v1/models model=-")


async def test_a_taken_port_fails_the_start_with_exit_1() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        async with running_demo("late", port=port, wait_until="started") as demo:
            assert await demo.wait_exit() == 1
            line = await demo.wait_for_output("cannot listen on", stderr=True)
            assert f"127.0.0.1:{port}" in line and "choose another --port" in line


async def test_bad_flags_exit_2_naming_the_flag() -> None:
    flags = ["--fake-vram", "lots", "--fake-gpu-dir", "/tmp"]
    async with running_demo("bad", flags, wait_until="started") as demo:
        assert await demo.wait_exit() == 2
        await demo.wait_for_output("--fake-vram: size 'lots'", stderr=True)
