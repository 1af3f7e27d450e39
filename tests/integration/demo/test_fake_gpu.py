"""--fake-vram, --fake-gpu-dir, --fake-gpu-total: the claim file's life and the emulated CUDA OOM."""

import os
import signal
from pathlib import Path

import aiohttp
import pytest

from llmswap.demo.fake_gpu import live_claims
from tests.helpers.demo import running_demo

pytestmark = pytest.mark.asyncio(loop_scope="module")

GB = 10**9


def file_names(directory: Path) -> list[str]:
    return sorted(entry.name for entry in directory.iterdir())


def dead_pid() -> int:
    # Above pid_max no process can exist.
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


async def test_claim_appears_when_healthy_and_goes_on_graceful_exit(tmp_path: Path) -> None:
    async with running_demo("gpu", ["--fake-vram", "2GB", "--fake-gpu-dir", str(tmp_path)]) as demo:
        claim = tmp_path / str(demo.pid)
        # The claim is written before /health first answers 200, so it is there now.
        assert claim.read_text().strip() == str(2 * GB)
        assert file_names(tmp_path) == [str(demo.pid)]
        demo.send_signal(signal.SIGTERM)
        assert await demo.wait_exit() == 0
        assert not claim.exists()


async def test_no_claim_while_not_healthy(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    flags = ["--never-healthy", "--fake-vram", "1GB", "--fake-gpu-dir", str(tmp_path)]
    async with running_demo("gpu", flags, wait_until="listening") as demo:
        async with http.get(f"{demo.url}/health") as response:
            assert response.status == 503
        assert file_names(tmp_path) == []


async def test_a_crash_releases_the_claim(tmp_path: Path) -> None:
    flags = ["--exit-after", "2", "--fake-vram", "1GB", "--fake-gpu-dir", str(tmp_path)]
    async with running_demo("gpu", flags) as demo:
        assert (tmp_path / str(demo.pid)).exists()
        assert await demo.wait_exit() == 3
        assert not (tmp_path / str(demo.pid)).exists()


async def test_sigkill_leaves_a_stale_claim_that_readers_ignore(tmp_path: Path) -> None:
    async with running_demo("gpu", ["--fake-vram", "1GB", "--fake-gpu-dir", str(tmp_path)]) as demo:
        assert live_claims(tmp_path) == GB
        demo.send_signal(signal.SIGKILL)
        assert await demo.wait_exit() == -signal.SIGKILL
        assert (tmp_path / str(demo.pid)).exists()
        assert live_claims(tmp_path) == 0


async def test_out_of_memory_when_live_claims_leave_too_little(tmp_path: Path) -> None:
    (tmp_path / str(os.getpid())).write_text(f"{3 * GB}\n")  # this test process holds 3 GB
    flags = ["--fake-vram", "2GB", "--fake-gpu-dir", str(tmp_path), "--fake-gpu-total", "4GB"]
    async with running_demo("big", flags, wait_until="started") as demo:
        assert await demo.wait_exit() == 1
        line = await demo.wait_for_output("CUDA error", stderr=True)
        assert line == f"CUDA error: out of memory (demo: need {2 * GB} bytes, {GB} free)"
        assert not any("listening" in line for line in demo.stdout_lines)


async def test_out_of_memory_check_ignores_dead_claims(tmp_path: Path) -> None:
    (tmp_path / str(dead_pid())).write_text(f"{3 * GB}\n")
    flags = ["--fake-vram", "2GB", "--fake-gpu-dir", str(tmp_path), "--fake-gpu-total", "4GB"]
    async with running_demo("big", flags) as demo:
        assert live_claims(tmp_path) == 2 * GB
        assert demo.returncode is None


async def test_second_demo_fits_only_after_the_first_lets_go(tmp_path: Path) -> None:
    total = ["--fake-gpu-dir", str(tmp_path), "--fake-gpu-total", "4GB"]
    async with running_demo("first", ["--fake-vram", "3GB", *total]) as first:
        async with running_demo("second", ["--fake-vram", "2GB", *total], wait_until="started") as refused:
            assert await refused.wait_exit() == 1
        first.send_signal(signal.SIGTERM)
        assert await first.wait_exit() == 0
        async with running_demo("second", ["--fake-vram", "2GB", *total]) as admitted:
            assert live_claims(tmp_path) == 2 * GB
            assert admitted.returncode is None
