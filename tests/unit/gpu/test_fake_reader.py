"""FakeReader: settable devices, and the demo upstream's per-PID files (live processes only)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil

from llmswap.machine import DeviceMemory, FakeReader, GiB, MiB


def _wait_until_zombie(pid: int) -> None:
    proc = psutil.Process(pid)
    deadline = time.monotonic() + 30
    while proc.status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"pid {pid} never became a zombie"
        time.sleep(0.01)


def test_fake_devices_have_settable_totals_and_extra_usage() -> None:
    reader = FakeReader([24 * GiB, 16 * GiB], names=["big", "small"])
    reader.set_extra_used(1, 4 * GiB)
    reader.set_total(2, 8 * GiB)
    assert reader.devices() == [
        DeviceMemory(0, "big", total=24 * GiB, used=0, free=24 * GiB),
        DeviceMemory(1, "small", total=16 * GiB, used=4 * GiB, free=12 * GiB),
        DeviceMemory(2, "Fake GPU 2", total=8 * GiB, used=0, free=8 * GiB),
    ]


def test_fake_in_memory_process_usage_counts_on_its_devices() -> None:
    reader = FakeReader([10 * GiB, 10 * GiB])
    reader.set_process_usage(4242, {0: 3 * GiB, 1: 1 * GiB})
    assert reader.process_usage(4242) == {0: 3 * GiB, 1: 1 * GiB}
    assert [d.free for d in reader.devices()] == [7 * GiB, 9 * GiB]
    reader.set_process_usage(4242, None)
    assert reader.process_usage(4242) == {}
    assert [d.used for d in reader.devices()] == [0, 0]


def test_fake_free_never_goes_negative() -> None:
    reader = FakeReader([1 * GiB])
    reader.set_extra_used(0, 2 * GiB)
    [device] = reader.devices()
    assert device.used == 2 * GiB and device.free == 0


def test_fake_gpu_dir_counts_only_files_of_live_processes(tmp_path: Path, spawn) -> None:
    live = spawn()
    other_live = spawn()
    dead = spawn("pass")
    dead.wait(timeout=30)
    zombie = spawn()
    os.kill(zombie.pid, signal.SIGKILL)
    _wait_until_zombie(zombie.pid)

    (tmp_path / str(live.pid)).write_text(f"{3 * GiB}\n")
    (tmp_path / str(other_live.pid)).write_text(f"{512 * MiB} 1")  # `<bytes> <device>`
    (tmp_path / str(dead.pid)).write_text(f"{5 * GiB}")  # a SIGKILLed demo's leftover
    (tmp_path / str(zombie.pid)).write_text(f"{7 * GiB}")  # killed, not yet reaped
    (tmp_path / f".{live.pid}.tmp").write_text(f"{9 * GiB}")  # a write in progress
    (tmp_path / "12345").write_text("not a number")

    reader = FakeReader([24 * GiB, 24 * GiB], gpu_dir=tmp_path)
    reader.set_extra_used(0, 1 * GiB)
    assert reader.file_usage() == {live.pid: {0: 3 * GiB}, other_live.pid: {1: 512 * MiB}}
    assert [d.used for d in reader.devices()] == [4 * GiB, 512 * MiB]
    assert reader.process_usage(live.pid) == {0: 3 * GiB}
    assert reader.process_usage(dead.pid) == {}
    # Both live children belong to this test process's tree.
    assert reader.process_usage(os.getpid()) == {0: 3 * GiB, 1: 512 * MiB}


def test_fake_gpu_dir_ignores_a_file_older_than_its_pids_process(tmp_path: Path, spawn) -> None:
    # The pid of a dead demo was reused by a newer process: the file predates that process.
    child = spawn()
    stale = tmp_path / str(child.pid)
    stale.write_text(f"{2 * GiB}")
    an_hour_ago = psutil.Process(child.pid).create_time() - 3600
    os.utime(stale, (an_hour_ago, an_hour_ago))
    assert FakeReader(gpu_dir=tmp_path).file_usage() == {}


def test_fake_gpu_dir_that_does_not_exist_yet_reads_as_empty(tmp_path: Path) -> None:
    reader = FakeReader([8 * GiB], gpu_dir=tmp_path / "later")
    assert reader.devices()[0].used == 0
    assert reader.process_usage(os.getpid()) == {}


def test_fake_reader_reports_the_gauges_it_was_given() -> None:
    from llmswap.machine.fake import FakeReader
    from llmswap.machine.units import GiB

    reader = FakeReader((8 * GiB, 4 * GiB))
    reader.set_extra_used(0, GiB)
    reader.set_gauges(0, util_pct=50.0, temp_c=70.0, power_w=120.0)
    first, second = reader.readings()
    assert (first.memory_used, first.util_pct, first.temp_c, first.power_w, first.fan_pct) == (
        GiB, 50.0, 70.0, 120.0, None)
    assert second.uuid == "GPU-fake-1" and second.util_pct is None
