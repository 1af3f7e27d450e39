"""The container image's contents, run as the image would run them: llmswap with the image's config serves
the demo, and with a config of its own starts the image's llama-server on a tiny GGUF and answers through it.

Containers cannot be started on these machines (`podman run` needs cgroups they lack), so .ci/image.sh
builds the image, mounts it (`podman image mount`) and passes the mount as LLMSWAP_IMAGE_ROOT; each test
runs the image's own llmswap from there under `chroot`, as the image's user (uid 10001), with the image's
environment, on loopback, in a mount namespace of its own (/proc, /dev, a tmpfs for /data and /tmp, the
models folder mounted at /models, and /etc/hosts as a runtime provides it). Skipped without
LLMSWAP_IMAGE_ROOT (needs root), failed instead when LLMSWAP_REQUIRE_IMAGE=1 (CI).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.helpers.demo import HOST, free_port
from tests.helpers.gguf_model import TinyLlama, tiny_llama

IMAGE_USER = "10001:10001"
IMAGE_ENV = {"PATH": "/app:/opt/llmswap/bin:/usr/local/bin:/usr/bin:/bin", "LLMSWAP_STATE_DIR": "/data",
             "HOME": "/data"}
WITHIN = 60.0


def image_root() -> Path:
    root = os.environ.get("LLMSWAP_IMAGE_ROOT", "")
    if root and Path(root, "opt/llmswap/bin/llmswap").is_file():
        return Path(root)
    reason = "no mounted image: .ci/image.sh builds one and prints its root (LLMSWAP_IMAGE_ROOT)"
    if os.environ.get("LLMSWAP_REQUIRE_IMAGE") == "1":
        pytest.fail(f"LLMSWAP_REQUIRE_IMAGE=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@contextlib.asynccontextmanager
async def image_llmswap(root: Path, models: Path, config: str, port: int) -> AsyncIterator[str]:
    """The image's llmswap, `-config config` (a path inside the image), on 127.0.0.1:`port`."""
    mounts = " && ".join([
        f"mount -t proc proc {root}/proc", f"mount --rbind /dev {root}/dev",
        f"mount -t tmpfs -o mode=1777 tmpfs {root}/tmp", f"mount -t tmpfs -o mode=0777 tmpfs {root}/data",
        f"mount --bind {models} {root}/models",
        f"mount --bind /etc/hosts {root}/etc/hosts",  # a container runtime writes it; the image's is empty
    ])
    env = " ".join(f"{key}={shlex.quote(value)}" for key, value in IMAGE_ENV.items())
    inside = f"cd /data && exec /opt/llmswap/bin/llmswap -config {config} -listen {HOST}:{port}"
    command = (f"{mounts} && cd {root} && exec chroot --userspec={IMAGE_USER} {root} env -i {env} "
               f"sh -c {shlex.quote(inside)}")
    process = await asyncio.create_subprocess_exec(
        "unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", command,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://{HOST}:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(int(WITHIN / 0.1)):
                if process.returncode is not None:
                    output = await process.stdout.read() if process.stdout else b""
                    raise AssertionError(f"the image's llmswap exited: {output.decode(errors='replace')}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{url}/health") as response:
                        if response.status == 200:
                            break
                await asyncio.sleep(0.1)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 20)
        except TimeoutError:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


async def chat(url: str, model: str) -> tuple[int, str]:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4,
            "temperature": 0}
    async with aiohttp.ClientSession() as http, http.post(f"{url}/v1/chat/completions", json=body,
                                                           timeout=aiohttp.ClientTimeout(total=WITHIN)) as r:
        answer = await r.json()
        return r.status, answer["choices"][0]["message"]["content"] if r.status == 200 else str(answer)


@pytest.fixture
def models(tmp_path: Path) -> Path:
    """The folder mounted at /models: a tiny GGUF and a config that serves it with the image's llama-server,
    readable by the image's user."""
    tmp_path.chmod(0o755)
    gguf = tiny_llama(TinyLlama("image-tiny", embedding=64, layers=2, feed_forward=192, heads=4, kv_heads=4,
                                context=256, seed=7), tmp_path)
    gguf.chmod(0o644)
    config = {"healthCheckTimeout": 60, "models": {"tiny": {
        "cmd": f"llama-server --host {HOST} --port ${{PORT}} -m /models/{gguf.name} -c 256 -t 1 --no-warmup",
        "proxy": f"http://{HOST}:${{PORT}}"}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "config.yaml").chmod(0o644)
    return tmp_path


async def test_the_images_llmswap_serves_the_demo_with_the_images_config(models: Path) -> None:
    root = image_root()
    async with image_llmswap(root, models, "/app/config.yaml", free_port()) as url:
        status, text = await chat(url, "gpt-4o-mini")  # an alias of the demo's small model
        assert status == 200 and text, text
        async with aiohttp.ClientSession() as http, http.get(f"{url}/running") as response:
            running = (await response.json())["running"]
        assert [entry["model"] for entry in running] == ["small"]


async def test_the_images_llama_server_answers_through_the_images_llmswap(models: Path) -> None:
    root = image_root()
    async with image_llmswap(root, models, "/models/config.yaml", free_port()) as url:
        status, text = await chat(url, "tiny")
        assert status == 200, text
        async with aiohttp.ClientSession() as http, http.get(f"{url}/running") as response:
            running = (await response.json())["running"]
        assert running[0]["model"] == "tiny" and "llama-server" in running[0]["cmd"]
