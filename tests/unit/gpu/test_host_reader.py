"""HostReader: host RAM as device 0, and RSS summed over a real process tree."""

from __future__ import annotations

import os

import psutil

from llmswap.machine import HostReader, MiB

ALLOCATE_50_MIB = (
    "import sys\n"
    "block = b'x' * (50 * 1024 * 1024)\n"  # written, so resident (a zeroed block may stay unmapped)
    "sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
    "sys.stdin.read()\n"
)


def test_host_device_is_the_machines_ram() -> None:
    [device] = HostReader().devices()
    vm = psutil.virtual_memory()
    assert device.index == 0 and device.name == "host RAM"
    assert device.total == vm.total
    assert 0 < device.free <= device.total
    assert device.used + device.free == device.total


def test_host_process_usage_counts_a_childs_rss_in_the_parents_tree(spawn) -> None:
    reader = HostReader()
    before = reader.process_usage(os.getpid())[0]
    child = spawn(ALLOCATE_50_MIB)
    assert child.stdout is not None
    assert child.stdout.readline() == b"ready\n"

    child_usage = reader.process_usage(child.pid)
    assert child_usage[0] >= 50 * MiB
    after = reader.process_usage(os.getpid())[0]
    # The child's 50 MiB plus its interpreter appear in the parent's tree total.
    assert after - before >= 45 * MiB


def test_host_process_usage_of_a_finished_process_is_empty(spawn) -> None:
    child = spawn("pass")
    child.wait(timeout=30)
    assert HostReader().process_usage(child.pid) == {}
