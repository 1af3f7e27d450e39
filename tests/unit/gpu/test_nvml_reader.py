"""NvmlReader and open_reader against a fake `pynvml` module (no GPU here), with real process trees."""

from __future__ import annotations

import logging
import os

import pytest

from llmswap.machine import DeviceMemory, GiB, HostReader, MiB, NvmlReader, open_reader
from tests.unit.gpu.fake_nvml import FakeGpu, FakeNvml

UNRELATED_PID = 2**22 + 17  # above Linux's pid_max: never one of ours


def test_nvml_devices_report_memory_and_names() -> None:
    nvml = FakeNvml([FakeGpu("NVIDIA RTX A", 24 * GiB, used=2 * GiB), FakeGpu(b"NVIDIA RTX B", 16 * GiB)])
    reader = NvmlReader(nvml)
    assert reader.kind == "nvml"
    assert reader.devices() == [
        DeviceMemory(0, "NVIDIA RTX A", total=24 * GiB, used=2 * GiB, free=22 * GiB),
        DeviceMemory(1, "NVIDIA RTX B", total=16 * GiB, used=0, free=16 * GiB),
    ]
    reader.close()


def test_nvml_process_usage_sums_the_process_tree_per_device(spawn) -> None:
    child = spawn()
    me = os.getpid()
    nvml = FakeNvml(
        [
            FakeGpu("A", 24 * GiB, compute=[(me, 100 * MiB), (child.pid, 3 * GiB), (UNRELATED_PID, 5 * GiB)]),
            FakeGpu("B", 24 * GiB, compute=[(UNRELATED_PID, 1 * GiB)], graphics=[(child.pid, 200 * MiB)]),
        ]
    )
    reader = NvmlReader(nvml)
    assert reader.process_usage(me) == {0: 100 * MiB + 3 * GiB, 1: 200 * MiB}
    assert reader.process_usage(child.pid) == {0: 3 * GiB, 1: 200 * MiB}
    reader.close()


def test_nvml_process_in_both_listings_counts_once(spawn) -> None:
    child = spawn()
    nvml = FakeNvml([FakeGpu("A", 24 * GiB, compute=[(child.pid, 2 * GiB)], graphics=[(child.pid, 2 * GiB)])])
    reader = NvmlReader(nvml)
    assert reader.process_usage(child.pid) == {0: 2 * GiB}
    reader.close()


def test_nvml_unattributed_memory_and_unsupported_listing_are_skipped(spawn) -> None:
    child = spawn()
    nvml = FakeNvml(
        [
            FakeGpu("A", 24 * GiB, compute=[(child.pid, None)]),  # Windows WDDM: no per-process figure
            FakeGpu("B", 24 * GiB, compute=[(child.pid, 1 * GiB)], graphics_supported=False),
        ]
    )
    reader = NvmlReader(nvml)
    assert reader.process_usage(child.pid) == {1: 1 * GiB}
    reader.close()


def test_nvml_process_usage_of_a_dead_pid_is_empty() -> None:
    nvml = FakeNvml([FakeGpu("A", 24 * GiB, compute=[(UNRELATED_PID, 1 * GiB)])])
    reader = NvmlReader(nvml)
    assert reader.process_usage(UNRELATED_PID + 1) == {}
    reader.close()


def test_nvml_close_shuts_down_once() -> None:
    nvml = FakeNvml([FakeGpu("A", 24 * GiB)])
    reader = NvmlReader(nvml)
    reader.close()
    reader.close()
    assert nvml.shutdown_calls == 1 and not nvml.initialised


def test_open_reader_uses_nvml_when_it_sees_a_gpu(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="llmswap.machine")
    nvml = FakeNvml([FakeGpu("A", 24 * GiB)])
    reader = open_reader(nvml=nvml)
    assert isinstance(reader, NvmlReader)
    assert [r.getMessage() for r in caplog.records] == []
    reader.close()


def test_open_reader_falls_back_to_host_when_nvml_fails_with_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="llmswap.machine")
    reader = open_reader(nvml=FakeNvml([], init_error="Driver Not Loaded"))
    assert isinstance(reader, HostReader)
    assert reader.kind == "host"
    records = [r for r in caplog.records if r.name.startswith("llmswap.machine")]
    assert len(records) == 1
    assert records[0].levelno == logging.DEBUG  # no GPU is the usual case without one: not worth a line
    assert "Driver Not Loaded" in records[0].getMessage()
    assert "host RAM" in records[0].getMessage()
    reader.devices()  # the fallback reads: one device, host RAM
    reader.close()


def test_open_reader_falls_back_when_nvml_sees_no_gpu(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="llmswap.machine")
    nvml = FakeNvml([])
    reader = open_reader(nvml=nvml)
    assert reader.kind == "host"
    assert nvml.shutdown_calls == 1  # NVML was initialised, so it is shut down again
    assert [r.getMessage() for r in caplog.records] == ["NVML sees no GPU; measuring host RAM instead"]


def test_open_reader_warns_when_nvml_was_asked_for_and_fails(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="llmswap.machine")
    reader = open_reader(prefer="nvml", nvml=FakeNvml([], init_error="NVML Shared Library Not Found"))
    assert reader.kind == "host"
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


def test_open_reader_host_never_touches_nvml() -> None:
    nvml = FakeNvml([FakeGpu("A", 24 * GiB)])
    assert open_reader(prefer="host", nvml=nvml).kind == "host"
    assert nvml.init_calls == 0


def test_open_reader_rejects_an_unknown_preference() -> None:
    with pytest.raises(ValueError, match=r"memory reader 'cuda' is unknown: use one of auto, nvml, host"):
        open_reader(prefer="cuda")


def test_open_reader_with_the_real_pynvml_gives_a_working_reader() -> None:
    # No NVIDIA driver on most test machines: this exercises the real import-and-fail path.
    reader = open_reader()
    try:
        devices = reader.devices()
        assert reader.kind in ("nvml", "host")
        assert devices and all(d.total > 0 and 0 <= d.free <= d.total for d in devices)
    finally:
        reader.close()


def test_nvml_gauges_read_each_gpu_and_leave_out_what_the_board_lacks() -> None:
    from llmswap.machine.reader import GpuGauges, GpuReading

    gpus = [FakeGpu("RTX A", 24 * GiB, used=2 * GiB, util=37, temperature=61, fan=44, power_mw=212_500,
                    uuid=b"GPU-aaaa"),
            FakeGpu("RTX B", 8 * GiB, util=0, fan=None)]
    reader = NvmlReader(FakeNvml(gpus))
    assert isinstance(reader, GpuGauges)
    first, second = reader.readings()
    assert first == GpuReading(0, "RTX A", "GPU-aaaa", memory_used=2 * GiB, memory_total=24 * GiB,
                               util_pct=37.0, temp_c=61.0, fan_pct=44.0, power_w=212.5)
    assert second.fan_pct is None and second.util_pct == 0.0
    assert reader.driver_version() == "550.54"
    assert not isinstance(HostReader(), GpuGauges)
